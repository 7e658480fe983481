"""`make agentgym-pipeline`: OpenManus-RL's pipeline on AgentGym's real TextCraft server, end to end.

1. the model: the tiny offline model (or SmolLM2-135M-Instruct with --model smollm2, converted offline);
2. the server: AgentGym's real TextCraft server started on 127.0.0.1 (or --env-url URL of a running one);
3. AgentGym's expert TextCraft trajectories (OpenManus-RL's data, ../shared/data/agentgym/textcraft) imported
   into the store with exact token ids;
4. the starting model evaluated on the held-out tasks first, so the store knows their goals; then an SFT warm
   start on the imported episodes whose goals are none of them, read back from the store;
5. GRPO iterations whose rollouts play the real server (the train split), scored with the default reward spec,
   updated and checkpointed;
6. the starting, warm-started and trained policies evaluated greedily on held-out tasks of the real server
   (the first N tasks of the test split, a seeded sample of it), with the server's own idea of success, side
   by side, each with the store's count of evaluated tasks found in its training lineage (held_out: clean).

Every number printed is read back from the store. Run ids are fixed (`<prefix>-sft`, `<prefix>-grpo`), so a
second run resumes where the first stopped, or only prints the results.
"""

from __future__ import annotations

import contextlib
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from trajlake.core.display import console, show
from trajlake.core.errors import TrajlakeError
from trajlake.core.paths import shared_dir
from trajlake.recipes.entry import add_overrides, check_folders, recipe_args, recipe_parser, run_recipe
from trajlake.recipes.stages import check_counts, layered, stage_config, train_stage
from trajlake.store import Lake

DEFAULT_DATA = shared_dir() / "data" / "agentgym" / "textcraft" / "train.parquet"
ENV = "agentgym/textcraft"


@dataclass(frozen=True)
class PipelineConfig:
    """What `python -m trajlake.recipes.agentgym_pipeline` runs; the defaults are `make agentgym-pipeline`'s."""

    lake: str = "lake"
    """Lake URI."""
    models: Path = Path("models")
    """Where models are built (`<models>/tiny`, `<models>/smollm2`)."""
    model: str = "tiny"
    """tiny (built offline in seconds) or smollm2 (SmolLM2-135M-Instruct, `make setup-smollm2` first)."""
    data: Path = DEFAULT_DATA
    """AgentGym's expert TextCraft trajectories (parquet, OpenManus-RL's format) to import and SFT on."""
    env_url: str | None = None
    """A running TextCraft server; None starts AgentGym's real one from ../shared/agentgym (or
    $TRAJLAKE_TEXTCRAFT_SERVER) on a free port of 127.0.0.1."""
    max_context_tokens: int = 2048
    """Imported episodes longer than this are left out of SFT (the tiny model's positions end at 2048)."""
    max_turns: int = 12
    """Turn cap per episode (the expert needs a median of 5 steps, 12 covers 93% of goals)."""
    max_new_tokens: int = 48
    """Reply length cap per turn."""
    eval_tasks: int = 30
    """Held-out tasks (test split) each policy is evaluated on, greedily."""
    prefix: str = "agentgym"
    """Run id prefix (another prefix starts the pipeline afresh in the same lake)."""
    checkpoints: Path = Path("checkpoints")
    """Where the train runs write their checkpoints."""
    seed: int = 0
    """Seeds the SFT and GRPO runs and the evaluation sampler."""
    progress: bool = True
    """Progress bars (stderr) and per-iteration lines."""
    sft: dict = field(default_factory=dict)
    """TrainConfig fields over the SFT stage's config (train/configs/sft-textcraft.toml: 60 steps of 8 episodes at
    lr 1e-3)."""
    grpo: dict = field(default_factory=dict)
    """TrainConfig fields over the GRPO stage's config (train/configs/grpo-textcraft.toml: 4 iterations of 8 tasks x
    4 samples at lr 1e-4)."""

    @property
    def rollout(self) -> dict:
        """The rollout settings every stage shares (a policy is evaluated the way it was trained). The template
        and system prompt are the env's defaults: ReAct replies, the preset's instructions. The server's URL once
        it is known (`run` starts one when none is given)."""
        url = {"env_url": self.env_url} if self.env_url else {}  # before the server starts: the stage file's
        return dict(env=ENV, **url, max_turns=self.max_turns, max_new_tokens=self.max_new_tokens)

    def __post_init__(self):
        if self.model not in PRESETS:
            raise TrajlakeError(f"agentgym pipeline: unknown model {self.model!r}; valid: {', '.join(PRESETS)}")
        for name in ("max_turns", "max_new_tokens", "eval_tasks", "max_context_tokens"):
            if getattr(self, name) < 1:
                raise TrajlakeError(f"agentgym pipeline: {name} must be >= 1, got {getattr(self, name)}")
        for stage, fields in STAGE_COUNTS.items():
            check_counts(self.stage_config(stage), stage, "agentgym pipeline", fields)
        if not Path(self.data).is_file():
            raise TrajlakeError(f"agentgym pipeline: no AgentGym TextCraft trajectories at {self.data} "
                                "(pass --data FILE: OpenManus-RL's textcraft train.parquet)")

    def stage_config(self, stage: str, **recipe: Any):
        """The TrainConfig of stage `stage` (sft or grpo): STAGE_CONFIGS' file under this config's fields for it
        (recipes/stages.py)."""
        return stage_config(self, stage, STAGE_CONFIGS[stage], "agentgym pipeline", **recipe)


#: each stage's train config (train/configs/), which PipelineConfig's `sft` and `grpo` fields override
STAGE_CONFIGS = {"sft": "sft-textcraft.toml", "grpo": "grpo-textcraft.toml"}
#: the stage fields the recipe counts with, each >= 1
STAGE_COUNTS = {"sft": ("sft_steps", "minibatch_size", "micro_batch"),
                "grpo": ("iterations", "tasks", "samples", "micro_batch")}

# SmolLM2 is 130x the tiny model: fewer, smaller steps at a pretrained model's learning rates.
PRESETS = {
    "tiny": {},
    "smollm2": dict(eval_tasks=20, prefix="agentgym-smollm2", sft=dict(sft_steps=40, minibatch_size=4, lr=2e-5),
                    grpo=dict(iterations=3, tasks=6, samples=4, lr=2e-6), micro_batch=2),
}


def import_expert_data(lake: Lake, data: Path, model: Path) -> str:
    """Import AgentGym's expert trajectories (idempotent); the import run's id."""
    from trajlake.interop.importers.agentgym import import_agentgym

    result = import_agentgym(lake, [data], model, env=ENV)
    console.print(str(result))
    return result.run_id


def sft_filter(import_run: str, max_tokens: int) -> str:
    """The imported episodes that fit the model's context and share no goal with a held-out task played so far
    (62 of the 100 test goals have an imported expert trajectory), as the SQL filter SFT reads from the store."""
    from trajlake.evaluate.contamination import outside_goals_of

    return (f"run_id = '{import_run}' AND episode_id IN (SELECT episode_id FROM turns GROUP BY episode_id "
            f"HAVING sum(num_prompt_tokens + num_response_tokens) <= {max_tokens}) AND {outside_goals_of()}")


@contextlib.contextmanager
def server_url(cfg: PipelineConfig):
    """`cfg.env_url`, or the URL of AgentGym's real TextCraft server started for the pipeline's duration."""
    if cfg.env_url:
        yield cfg.env_url
        return
    from trajlake.collect.envs.agentgym_launch import textcraft_server

    log = Path("reports") / f"{cfg.prefix}-textcraft-server.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with textcraft_server(log=log) as server:
        console.print(f"AgentGym's TextCraft server on {server.url} (log: {log})")
        yield server.url


def run(cfg: PipelineConfig) -> None:
    # the demo's evaluation takes any config with `rollout`, `eval_tasks`, `seed` and `progress`: the same code
    # runs both
    from trajlake.recipes.demo import build_model, evaluate_policies, grpo_curve, results_table

    t0 = time.perf_counter()
    check_folders(cfg.lake, models=cfg.models, checkpoints=cfg.checkpoints)
    console.rule("1. the model")
    model = build_model(cfg.models, cfg.model)
    with server_url(cfg) as url, Lake.open(cfg.lake) as lake:
        cfg = replace(cfg, env_url=url)
        console.rule("2. AgentGym's expert TextCraft trajectories into the store")
        import_run = import_expert_data(lake, cfg.data, model)
        console.rule("3. the starting model on the held-out tasks (so the store knows their goals)")
        evaluate_policies(cfg, lake, [f"hf:{model}"], model)
        console.rule("4. SFT warm start on the imported episodes whose goals are not held out")
        sft_run = f"{cfg.prefix}-sft"
        stage = cfg.stage_config("sft")
        sft = train_stage(lake, stage.replace(run_id=sft_run, model=str(model),
                                        micro_batch=min(stage.optim.micro_batch, stage.optim.minibatch_size),
                                        sft_filter=sft_filter(import_run, cfg.max_context_tokens)))
        console.print(f"run {sft.run_id}: policy {sft.policy_id}")
        stage = cfg.stage_config("grpo")
        console.rule(f"5. GRPO on the real server: {stage.run.iterations} iterations of collect -> score -> update")
        # one optimizer step per iteration unless the grpo stage says otherwise
        batch = cfg.grpo.get("minibatch_size", stage.rollout.tasks * stage.rollout.samples)
        grpo = train_stage(lake, stage.replace(run_id=f"{cfg.prefix}-grpo", model=f"run:{sft_run}",
                                         minibatch_size=batch))
        console.print(f"run {grpo.run_id}: policy {grpo.policy_id}")
        console.rule("6. held-out evaluation on the real server, before and after")
        stages = {"start": f"hf:{model}", "SFT on AgentGym's experts": f"policy:{sft.policy_id}",
                  "GRPO on the real server": f"policy:{grpo.policy_id}"}
        table = results_table(evaluate_policies(cfg, lake, list(stages.values()), model), stages)
        console.rule("7. results (read back from the store)")
        console.print(f"held-out greedy success on AgentGym TextCraft (the first {cfg.eval_tasks} tasks of the test "
                      f"split, {cfg.max_turns} turns), 95% Wilson intervals")
        show(table)
        console.print("GRPO curve (sampled rollouts of each iteration on the train split, from train_steps):")
        show(grpo_curve(lake, grpo.run_id, metrics=("success_mean", "reward_mean", "entropy")))
    console.print(f"lake: {cfg.lake}; pipeline finished in {time.perf_counter() - t0:.0f} s")


def main(argv: list[str] | None = None) -> int:
    parser = recipe_parser("trajlake.recipes.agentgym_pipeline", __doc__)
    parser.add_argument("--models", type=Path, default=Path("models"), help="where models are built")
    parser.add_argument("--model", choices=tuple(PRESETS), default="tiny", help="the model to train")
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="AgentGym TextCraft trajectories (parquet)")
    parser.add_argument("--env-url", default=None, help="a running TextCraft server (default: start the real one)")
    add_overrides(parser, ("sft_steps", "iterations", "tasks", "samples", "micro_batch", "max_turns", "eval_tasks"))
    parser.add_argument("--prefix", default=None, help="run id prefix (default agentgym)")
    args = recipe_args(parser, argv)
    chosen = {k: v for k, v in args.items() if v is not None}
    return run_recipe(run, lambda: PipelineConfig(**layered(PRESETS[args["model"]], chosen)))


if __name__ == "__main__":
    sys.exit(main())
