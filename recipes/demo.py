"""`make demo`: RL beats imitation on a multi-turn task, on a CPU, in minutes, every number from the store.

The task: doors difficulty 3, two rooms, each key written on a sign (read it, then open that door: four turns
for the expert). The demonstrator is noisy (`scripted:doors?noise=0.9`): in front of a sign it reads it one
time in ten and otherwise opens a door at random. Its successful episodes are mostly lucky guesses, so
imitating them, however long, learns to guess; RL from that policy finds that reading pays.

1. the model: the tiny offline model (or SmolLM2-135M-Instruct with --model smollm2, converted offline);
2. OpenManus-RL's own AgentGym trajectories imported with exact token ids (when ../shared has them);
3. the noisy demonstrator's episodes collected into the store;
4. the starting model evaluated on held-out tasks (its episodes are stored too);
5. SFT on the successful demonstrations, read back from the store, checkpointed every `sft_every` steps;
   each checkpoint evaluated greedily on the val split: the best is the SFT plateau;
6. GRPO iterations from the plateau: collect with the current policy, score with the default spec, update;
7. the start, the SFT plateau and the RL policy evaluated greedily on the same held-out test tasks;
8. the results table with 95% intervals, the learning curve, and an HTML report.

Run ids are fixed (`<prefix>-expert`, `<prefix>-sft`, `<prefix>-grpo`), so a second run resumes where the
first stopped, or only prints the results. bench/learning.py runs the same recipe over several seeds.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl

from trajlake.core.display import console, show
from trajlake.core.errors import TrajlakeError
from trajlake.core.paths import shared_dir
from trajlake.recipes.entry import add_overrides, check_folders, recipe_args, recipe_parser, run_recipe
from trajlake.recipes.plateau import choose_rollout_temperature, rl_best_on_val, sft_to_plateau
from trajlake.recipes.stages import check_counts, layered, stage_config, train_stage
from trajlake.store import Lake

DEFAULT_DATA = shared_dir() / "data" / "agentgym"


@dataclass(frozen=True)
class DemoConfig:
    """What `python -m trajlake.recipes.demo` runs; the defaults are `make demo`'s (bench/learning.py shares them)."""

    lake: str = "lake"
    """Lake URI."""
    models: Path = Path("models")
    """Where models are built (`<models>/tiny`, `<models>/smollm2`)."""
    model: str = "tiny"
    """tiny (built offline in seconds) or smollm2 (SmolLM2-135M-Instruct, `make setup-smollm2` first)."""
    data: Path | None = DEFAULT_DATA
    """Folder of AgentGym parquet files to import (None or absent: skipped)."""
    checkpoints: Path = Path("checkpoints")
    """Where the train runs write their checkpoints."""
    env: str = "doors"
    """The env played: a built-in, or an AgentGym server's (`agentgym/textcraft` with `env_url`; bench/learning.py)."""
    env_url: str | None = None
    """The URL of the env's server, for an AgentGym env (None for the built-ins)."""
    difficulty: int | None = 3
    """doors difficulty: 3 is two rooms with the key on a sign in each (read, open, read, open). None for an env
    without levels (AgentGym's)."""
    max_turns: int = 6
    """Turn cap of every episode (the expert needs 4 at difficulty 3); an episode cut there scores as a loss."""
    template: str = "plain"
    """The action template every stage plays with (plain: the reply is the action alone)."""
    max_new_tokens: int = 8
    """Reply length cap per turn (doors' actions are two words; TextCraft's recipes need about 24 tokens)."""
    expert_noise: float = 0.9
    """The demonstrator's noise: at each turn it plays the env's hasty mistake (or, where it has none, another
    valid action) with this probability."""
    demos: int = 2048
    """Demonstration tasks played from the train split (about one in ten succeeds at noise 0.9; SFT reads the
    successful)."""
    demos_from: Path | None = None
    """A trajectory file (OpenManus-RL's / AgentGym's parquet) whose successful episodes are the demonstrations
    instead of the noisy demonstrator's, imported into the store and restricted to goals outside the held-out
    tasks (the start model plays those first, so their goals are known)."""
    demo_offset: int = 0
    """The first train task the demonstrations play (collect's task_offset): with a bounded train split, the
    demonstrations can cover its end while GRPO's iterations play its start, goals SFT never saw."""
    demo_samples: int = 1
    """Demonstrations per task (a noisy demonstrator plays each task this many times, each its own draw): more
    demonstrations on an env whose train split is small (TextCraft's 344 goals)."""
    sft_patience: int = 2
    """SFT stops once this many checkpoints in a row bring no gain on val over the best (a plateau), else at the
    SFT stage's sft_steps (the cap; the recipe says which)."""
    temperatures: tuple[float, ...] = ()
    """A sweep on val before GRPO: the SFT plateau's sampled success at each of these temperatures against its
    greedy success; GRPO samples at the highest it survives (evaluate/temperature.py). Empty: the GRPO stage's
    temperature."""
    eval_tasks: int = 100
    """Held-out test tasks each policy is evaluated on, greedily."""
    val_tasks: int | None = None
    """Val tasks of every choice made on val (each SFT checkpoint, the temperature sweep, GRPO's evaluations);
    None: eval_tasks. Fewer than the test's 100 where evaluations decide what fits in the time (SmolLM2 on 2
    cores); the choices' intervals widen accordingly."""
    seed: int = 0
    """Seeds the demonstrations, the SFT and GRPO runs and the samplers."""
    report: Path = Path("reports/demo")
    """Where the HTML report goes."""
    prefix: str = "demo"
    """Run id prefix (another prefix starts the pipeline afresh in the same lake)."""
    progress: bool = True
    """Progress bars and per-stage tables (bench/learning.py turns them off)."""
    sft: dict = field(default_factory=dict)
    """TrainConfig fields over the SFT stage's config (SFT_CONFIG): its `sft_steps` is the cap, `checkpoint_every`
    the steps between val evaluations, `minibatch_size` the demonstrations a step, `lr`, `micro_batch`..."""
    grpo: dict = field(default_factory=dict)
    """TrainConfig fields over the GRPO stage's config (GRPO_CONFIG): `iterations`, `tasks`, `samples`, `lr`,
    `temperature` (unless `temperatures` sweeps), `task_selector`, `eval_every` (its greedy evaluations on val, the
    RL policy being its best checkpoint there), `advantage`, `kl_coef`..."""

    @property
    def rollout(self) -> dict:
        """The rollout settings every stage shares (the policy must be evaluated the way it was trained)."""
        return dict(env=self.env, env_url=self.env_url, difficulty=self.difficulty, max_turns=self.max_turns,
                    template=self.template, max_new_tokens=self.max_new_tokens)

    @property
    def val_eval_tasks(self) -> int:
        """How many val tasks each choice on val plays."""
        return self.eval_tasks if self.val_tasks is None else self.val_tasks

    @property
    def expert(self) -> str:
        return f"scripted:{self.env}" + (f"?noise={self.expert_noise:g}" if self.expert_noise else "")

    def __post_init__(self):
        if self.model not in PRESETS:
            raise TrajlakeError(f"demo: unknown model {self.model!r}; valid: {', '.join(PRESETS)}")
        from trajlake.collect.envs import make_env

        try:
            levels = make_env(self.env).difficulties
        except KeyError as e:  # an unknown env: its message lists the valid ones
            raise TrajlakeError(f"demo: {e.args[0]}") from None
        if levels and self.difficulty not in levels:
            raise TrajlakeError(f"demo: difficulty of {self.env} must be one of {', '.join(map(str, levels))}, "
                                f"got {self.difficulty}")
        if not levels and self.difficulty is not None:
            raise TrajlakeError(f"demo: {self.env} has no difficulty levels; leave difficulty unset")
        if not 0.0 <= self.expert_noise <= 1.0:
            raise TrajlakeError(f"demo: expert_noise must be between 0 and 1, got {self.expert_noise}")
        for name in ("max_turns", "max_new_tokens", "demos", "demo_samples", "sft_patience", "eval_tasks"):
            if getattr(self, name) < 1:
                raise TrajlakeError(f"demo: {name} must be >= 1, got {getattr(self, name)}")
        if self.val_tasks is not None and self.val_tasks < 1:
            raise TrajlakeError(f"demo: val_tasks must be >= 1 (or unset: eval_tasks), got {self.val_tasks}")
        if self.demo_offset < 0:
            raise TrajlakeError(f"demo: demo_offset must be >= 0, got {self.demo_offset}")
        for stage, fields in STAGE_COUNTS.items():
            check_counts(self.stage_config(stage), stage, "demo", fields)
        sft = self.stage_config("sft")
        if sft.checkpoint.every > sft.sft.steps:
            raise TrajlakeError(f"demo: the sft stage's checkpoint_every ({sft.checkpoint.every}) must be <= its "
                                f"sft_steps ({sft.sft.steps})")

    def stage_config(self, stage: str, **recipe: Any):
        """The TrainConfig of stage `stage` (sft or grpo): STAGE_CONFIGS' file under this config's fields for it
        (recipes/stages.py)."""
        return stage_config(self, stage, STAGE_CONFIGS[stage], "demo", **recipe)


#: each stage's train config (train/configs/), which DemoConfig's `sft` and `grpo` fields override
STAGE_CONFIGS = {"sft": "sft-doors-noisy.toml", "grpo": "grpo-doors-noisy.toml"}
#: the stage fields the recipe counts with, each >= 1
STAGE_COUNTS = {"sft": ("sft_steps", "checkpoint_every", "minibatch_size", "micro_batch"),
                "grpo": ("iterations", "tasks", "samples", "micro_batch", "eval_every")}
# SmolLM2 is 130x the tiny model: fewer, smaller steps at a pretrained model's learning rates (RL at the anchors'
# 1e-6), its rollout temperature measured on val, and train tasks chosen from what it sometimes wins.
PRESETS = {
    "tiny": {},
    "smollm2": dict(demos=256, eval_tasks=30, temperatures=(0.3, 0.5, 0.7, 1.0), prefix="demo-smollm2",
                    report=Path("reports/demo-smollm2"),
                    sft=dict(sft_steps=40, checkpoint_every=5, lr=2e-5, micro_batch=8),
                    grpo=dict(iterations=5, tasks=16, samples=4, lr=1e-6, micro_batch=8, eval_every=1,
                              task_selector="learnable")),
}


@dataclass(frozen=True)
class RecipeResult:
    """What one run of the recipe produced: the policies of each stage and how long each stage took."""

    expert_success: float
    val_by_step: dict[int, float]
    plateau_step: int
    policies: dict[str, str]
    """stage -> policy spec: start, SFT plateau, GRPO (its best checkpoint on val)."""
    grpo_run: str
    seconds: dict[str, float]
    plateau_reason: str = ""
    """Why SFT stopped where it did: a plateau on val, or the cap."""
    temperature: float = 1.0
    """The temperature GRPO sampled at (measured when the config sweeps)."""
    rl_val_by_step: dict[int, float] = field(default_factory=dict)
    """GRPO's greedy val success by iteration (0: the SFT plateau it started from)."""
    rl_choice: str = ""
    """Which GRPO checkpoint is the RL policy, and why."""


def build_model(models: Path, model: str) -> Path:
    """`<models>/<model>` (tiny or smollm2), built offline when it is not there yet; its absolute path."""
    from trajlake.lm.build import build_tiny_model, model_summary

    path = models / model
    if not (path / "model.safetensors").exists():
        if model == "tiny":
            build_tiny_model(path)
        else:
            from trajlake.lm.smollm2 import convert_smollm2

            convert_smollm2(path)
    console.print(f"model {path}: {model_summary(path)['params']:,} parameters")
    return path.absolute()


def import_seed_data(lake: Lake, data: Path | None, model: Path) -> None:
    from trajlake.interop.importers.agentgym import import_agentgym
    from trajlake.store.reads import imported_summary

    files = sorted(data.glob("*/*.parquet")) if data and data.is_dir() else []
    if not files:
        console.print(f"no AgentGym files under {data}: skipping the import (pass --data DIR)")
        return
    console.print(str(import_agentgym(lake, files, model)))
    show(imported_summary(lake))  # their success_rate: n/a, AgentGym's files carry no success flag


def collect_demonstrations(cfg: DemoConfig, lake: Lake, model: Path) -> tuple[str, float]:
    """The noisy demonstrator's episodes (or `demos_from`'s) into the store; their run id and success rate."""
    from trajlake.collect.config import CollectConfig
    from trajlake.collect.rollout import collect
    from trajlake.interop.importers.agentgym import import_agentgym

    if cfg.demos_from:
        rid = import_agentgym(lake, [cfg.demos_from], model, env=cfg.env, progress=cfg.progress).run_id
    else:
        demos = CollectConfig(policy=cfg.expert, tokenizer=str(model), tasks=cfg.demos, samples=cfg.demo_samples,
                              task_offset=cfg.demo_offset, seed=cfg.seed, run_id=f"{cfg.prefix}-expert",
                              progress=cfg.progress, **cfg.rollout)
        rid = collect(demos, lake)
    n, s = lake.query("SELECT count(*) AS n, avg(success::INT) AS s FROM episodes WHERE run_id = ? "
                      "AND status IS DISTINCT FROM 'error'", [rid]).row(0)  # env errors say nothing of the expert
    if cfg.progress:
        console.print(f"run {rid}: {n} episodes of {cfg.demos_from or cfg.expert}, success rate {s or 0:.2f}")
    return rid, s or 0.0


def demonstrations_filter(cfg: DemoConfig, run_id: str) -> str:
    """The SFT filter: the demonstrations' successful episodes; imported ones only where their goal is no
    held-out task's (played before SFT, so the store knows those goals)."""
    from trajlake.evaluate.contamination import outside_goals_of

    where = f"success AND run_id = '{run_id}'"
    return f"{where} AND {outside_goals_of()}" if cfg.demos_from else where


def evaluate_policies(cfg: DemoConfig, lake: Lake, policies: list[str], model: Path,
                      split: str = "test") -> pl.DataFrame:
    from trajlake.evaluate.config import EvalConfig
    from trajlake.evaluate.run import evaluate

    tasks = cfg.val_eval_tasks if split == "val" else cfg.eval_tasks  # only a DemoConfig evaluates on val
    ec = EvalConfig(policies=tuple(policies), split=split, tasks=tasks, greedy=True, tokenizer=str(model),
                    seed=cfg.seed, progress=cfg.progress, **cfg.rollout)
    return evaluate(ec, lake).summary


def recipe(cfg: DemoConfig, lake: Lake, model: Path) -> RecipeResult:
    """Demonstrations, SFT to its plateau, GRPO from the plateau (stages 3-6); each stage resumes if stored."""
    seconds, t = {}, time.perf_counter()
    log = console.rule if cfg.progress else (lambda *_: None)
    log(f"3. the demonstrations into the store ({cfg.demos_from or cfg.expert})")
    demos, expert = collect_demonstrations(cfg, lake, model)
    log("4. the starting model on held-out tasks")
    evaluate_policies(cfg, lake, [f"hf:{model}"], model)
    if cfg.demos_from:  # their goals, before SFT reads the imported episodes outside them
        evaluate_policies(cfg, lake, [f"hf:{model}"], model, split="val")
    log(f"5. SFT on the successful demonstrations, a checkpoint every {cfg.stage_config('sft').checkpoint.every} "
        "steps, each on val")
    seconds["demos_s"], t = time.perf_counter() - t, time.perf_counter()
    sft = sft_to_plateau(cfg, lake, model, demonstrations_filter(cfg, demos), train_stage=train_stage,
                         evaluate_policies=evaluate_policies)
    val, plateau = sft.val_by_step, sft.step
    seconds["sft_s"], t = time.perf_counter() - t, time.perf_counter()
    sft_policy = f"policy:{cfg.prefix}-sft/step-{plateau}"
    if cfg.progress:
        show(pl.DataFrame({"sft_step": list(val), "val_success": list(val.values())}))
    console.print(f"SFT plateau: step {plateau} (the best on val); SFT stopped at step {max(val)}: {sft.reason}",
                  soft_wrap=True)
    # GRPO's evaluations on val play val_tasks, and it reports to TensorBoard, unless the grpo stage says otherwise
    stage = cfg.stage_config("grpo", eval_tasks=cfg.val_eval_tasks, report_to=["tensorboard"])
    temperature = choose_rollout_temperature(cfg, lake, sft_policy, model, default=stage.rollout.temperature)
    log(f"6. GRPO from the SFT plateau: {stage.run.iterations} iterations of collect -> score -> update -> checkpoint")
    # one optimizer step per iteration unless the grpo stage says otherwise (e.g. minibatch_size=16: RAGEN's
    # several mini-batch steps per iteration)
    batch = cfg.grpo.get("minibatch_size", stage.rollout.tasks * stage.rollout.samples)
    grpo = train_stage(lake, stage.replace(run_id=f"{cfg.prefix}-grpo", model=sft_policy, temperature=temperature,
                                     minibatch_size=batch))
    seconds["grpo_s"] = time.perf_counter() - t
    seconds["grpo_s_per_iteration"] = seconds["grpo_s"] / stage.run.iterations
    rl_policy, rl_val, choice = rl_best_on_val(lake, grpo.run_id, grpo.policy_id)
    console.print(f"GRPO policy: {choice}", soft_wrap=True)
    policies = {"start": f"hf:{model}", f"SFT plateau (step {plateau})": sft_policy,
                f"GRPO (best on val, {rl_policy.rsplit('/', 1)[-1]})": rl_policy}
    return RecipeResult(expert, val, plateau, policies, grpo.run_id, seconds, sft.reason, temperature, rl_val,
                        choice)


def results_table(summary: pl.DataFrame, stages: dict[str, str]) -> pl.DataFrame:
    """One row per stage: its policy's held-out success with its interval, and whether the store finds any of the
    evaluated tasks in the policy's training lineage (`held_out`: clean, or how many tasks were trained on)."""
    from trajlake.evaluate.metrics import held_out_label

    rows = []
    for stage, policy in stages.items():
        r = summary.filter(pl.col("policy") == policy).row(0, named=True)
        short = policy.removeprefix("policy:") if policy.startswith("policy:") else Path(policy[3:]).name
        rows.append({"stage": stage, "policy": short, "episodes": r["episodes"],
                     "success": f"{r['success_rate']:.2f} [{r['success_low']:.2f}, {r['success_high']:.2f}]",
                     "reward": round(r["reward_mean"], 3), "format_errors": round(r["format_error_rate"], 3),
                     "turns": round(r["mean_turns"], 2), "tokens": round(r["tokens_per_episode"], 1),
                     "held_out": held_out_label(r["contaminated_tasks"], r["tasks"])})
    return pl.DataFrame(rows)


#: the GRPO curve the recipes print, each step's metrics read as the viewer and the report read them
#: (view.train_data.metric): metric -> (column, decimals, what a step without it shows)
CURVE = {"success_mean": ("sampled_success", 3, None), "eval_success": ("greedy_val_success", 3, "-"),
         "outcome_groups": ("groups_with_outcome_difference", 3, None), "sampling_rounds": ("rounds", 0, 1),
         "kl": ("kl_to_start", 5, "-"), "reward_mean": ("reward_mean", 3, None), "entropy": ("entropy", 3, None),
         "collect_s": ("collect_s", 1, None), "update_s": ("update_s", 1, None)}


def grpo_curve(lake: Lake, run_id: str, every: int = 1, metrics: tuple[str, ...] = tuple(CURVE)) -> pl.DataFrame:
    """GRPO run `run_id`'s iterations (every `every`-th, the first and each one evaluated) with CURVE's `metrics`,
    from its train_steps rows."""
    from trajlake.view.train_data import metric, read_steps

    rows = []
    for s in read_steps(lake, lake.current_snapshot(), [run_id]).get(run_id, []):
        if s["step"] < 1 or not (s["step"] % every == 0 or s["step"] == 1 or metric(s, "eval_success") is not None):
            continue
        row = {"iteration": s["step"]}
        for key in metrics:
            column, digits, missing = CURVE[key]
            value = metric(s, key)
            value = missing if value is None else round(value, digits) if digits else int(value)
            row[column] = str(value) if isinstance(missing, str) else value
        rows.append(row)
    return pl.DataFrame(rows)


def run(cfg: DemoConfig) -> None:
    from trajlake.view.report import build_report

    t0 = time.perf_counter()
    check_folders(cfg.lake, models=cfg.models, checkpoints=cfg.checkpoints, report=cfg.report)
    console.rule("1. the model")
    model = build_model(cfg.models, cfg.model)
    with Lake.open(cfg.lake) as lake:
        console.rule("2. import OpenManus-RL's AgentGym trajectories")
        import_seed_data(lake, cfg.data, model)
        result = recipe(cfg, lake, model)
        console.rule("7. held-out evaluation: start, SFT plateau, GRPO")
        summary = evaluate_policies(cfg, lake, list(result.policies.values()), model)
        console.rule("8. results (read back from the store)")
        console.print(f"held-out greedy success on {cfg.env} (test split, difficulty {cfg.difficulty}, "
                      f"{cfg.eval_tasks} tasks), 95% Wilson intervals; demonstrations: {cfg.expert}, "
                      f"success {result.expert_success:.2f}")
        show(results_table(summary, result.policies))
        start_val = result.rl_val_by_step.get(0)
        start = f"; the plateau's greedy val success before the first: {start_val:.2f}" if start_val is not None else ""
        console.print("GRPO learning curve (each iteration's sampled rollouts on train tasks, greedy val success where "
                      "evaluated, the share of groups whose samples differ in success, KL to the SFT plateau, stage "
                      f"times; from train_steps{start}):")
        show(grpo_curve(lake, result.grpo_run, max(1, cfg.stage_config("grpo").run.iterations // 5)))
        index = build_report(lake, cfg.report)
    console.print(f"report: {index}")
    console.print(f"the GRPO run's curves: tensorboard --logdir {cfg.checkpoints}/{cfg.prefix}-grpo/tensorboard; "
                  f"its episodes token by token: .venv/bin/trajlake --lake {cfg.lake} view")
    console.print(f"lake: {cfg.lake}; explore it with: .venv/bin/trajlake --lake {cfg.lake} sql "
                  "(queries to start from: docs/queries/)")
    console.print(f"demo finished in {time.perf_counter() - t0:.0f} s")


#: the integer flags the command line takes: DemoConfig fields and STAGE_FLAGS (the rest are for bench/learning.py
#: and tests)
CLI_INTS = ("difficulty", "max_turns", "demos", "sft_steps", "sft_every", "iterations", "tasks", "samples",
            "micro_batch", "eval_tasks", "seed")


def main(argv: list[str] | None = None) -> int:
    parser = recipe_parser("trajlake.recipes.demo", __doc__)
    parser.add_argument("--models", type=Path, default=Path("models"), help="where models are built")
    parser.add_argument("--model", choices=tuple(PRESETS), default="tiny", help="the model to train")
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="folder of AgentGym parquet files")
    parser.add_argument("--checkpoints", type=Path, default=None, help="checkpoint folder (default checkpoints)")
    add_overrides(parser, CLI_INTS)
    add_overrides(parser, ["expert_noise"], float)
    parser.add_argument("--report", type=Path, default=None, help="report folder (default reports/demo)")
    parser.add_argument("--prefix", default=None, help="run id prefix (default demo)")
    args = recipe_args(parser, argv)
    chosen = {k: v for k, v in args.items() if v is not None}
    return run_recipe(run, lambda: DemoConfig(**layered(PRESETS[args["model"]], chosen)))


if __name__ == "__main__":
    sys.exit(main())
