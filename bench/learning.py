"""Does RL beat imitation? The demo's recipe (SFT to its plateau, then GRPO from it) over several seeds, on a
built-in env or on an AgentGym server's env.

    .venv/bin/python bench/learning.py                            # make demo's settings, 3 seeds
    .venv/bin/python bench/learning.py --expert-noise 0.5 --advantage gigpo --seeds 1
    .venv/bin/python bench/learning.py --env agentgym/textcraft --seeds 3          # AgentGym's real TextCraft
    .venv/bin/python bench/learning.py --env agentgym/textcraft --env-url http://127.0.0.1:36001 \\
        --train horizon_start=2 --train reward_spec=rewards/specs/textcraft-progress.toml

Per seed, in a lake of its own: the noisy demonstrator plays `--demos` tasks of the train split (x
`--demo-samples`); SFT on its successful episodes, checkpointed every `--sft-every` steps, each checkpoint
evaluated greedily on held-out val tasks, the best being the SFT plateau; GRPO from the plateau on the train
split; the start, the plateau and the RL policy evaluated greedily on the same held-out test tasks. Prints each
seed's test success (95% Wilson interval), how many test tasks the store finds in each policy's training lineage
(`contaminated`: 0 means the number is held out), the mean gain over seeds and each stage's time. For
`agentgym/textcraft` without `--env-url`, AgentGym's real TextCraft server (../shared/agentgym) is started on a
free port of 127.0.0.1 and stopped at the end. The recipe is trajlake.recipes.demo.recipe: what `make demo` runs.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import tempfile
import time
import tomllib
from dataclasses import replace
from pathlib import Path

import polars as pl

from trajlake.core.display import console, show
from trajlake.core.errors import TrajlakeError
from trajlake.recipes.demo import CLI_INTS, DemoConfig, build_model, evaluate_policies, grpo_curve, recipe
from trajlake.recipes.entry import stop_cleanly_on_sigterm
from trajlake.recipes.stages import layered
from trajlake.store import Lake

#: GRPO config fields the bench sets by name besides the recipe's flags (recipes/demo.py STAGE_FLAGS)
TRAIN_FLOATS = ("kl_coef", "entropy_coef", "gamma", "clip_high")
#: what the recipe plays an AgentGym TextCraft server with when not told otherwise: its actions are whole recipe
#: lines (about 24 tokens). The splits are stratified by crafting depth (one distribution: docs/agentgym.md). The
#: planner's demonstrations cover the last 172 tasks of the train split's order and GRPO chooses among the first
#: 172, goals SFT never saw (SFT memorises its demonstrations' goals, so GRPO on those would compare samples that
#: all replay them): `learnable` plays first the goals its policies sometimes win. SFT runs to a plateau on val
#: (3 checkpoints without gain, at most 600 steps); the rollout temperature is measured on val; GRPO evaluates
#: on val every 2 iterations, keeps its best checkpoint there and stops below its start's interval.
TEXTCRAFT = dict(difficulty=None, max_turns=8, max_new_tokens=32, expert_noise=0.0, demos=172, demo_offset=172,
                 demo_samples=1, sft_patience=3, eval_tasks=100, temperatures=(0.3, 0.5, 0.7, 1.0),
                 sft=dict(sft_steps=600, checkpoint_every=100, micro_batch=8),
                 grpo=dict(iterations=10, tasks=16, samples=8, micro_batch=8, eval_every=2,
                           task_selector="learnable",
                           # the env's own progress observations as per-turn rewards
                           reward_spec=str(Path(__file__).resolve().parent.parent / "rewards" / "specs" /
                                           "textcraft-progress.toml"), task_pool=172))
#: SmolLM2-135M on TextCraft: a pretrained model's learning rates (RL at the anchors' 1e-6 for full weights; the
#: tiny model's 2e-4 and 1e-3 are for a model trained from scratch)
TEXTCRAFT_SMOLLM2 = dict(sft=dict(lr=2e-5, checkpoint_every=20, sft_steps=200), grpo=dict(lr=1e-6))


def one_seed(cfg: DemoConfig, model: Path) -> dict:
    with Lake.open(cfg.lake) as lake:
        r = recipe(cfg, lake, model)
        summary = evaluate_policies(cfg, lake, list(r.policies.values()), model)
        console.print(f"seed {cfg.seed}: GRPO by iteration (sampled success on its train tasks, greedy val success "
                      "where evaluated, the share of groups with an outcome difference, sampling rounds, KL to the "
                      "plateau, stage times; from train_steps):", soft_wrap=True)
        show(grpo_curve(lake, r.grpo_run))
    test = {}
    for stage, policy in r.policies.items():
        row = summary.filter((pl.col("policy") == policy) & (pl.col("difficulty") == "all")).row(0, named=True)
        test[stage.split(" ")[0]] = (row["success_rate"], row["success_low"], row["success_high"],
                                     row["contaminated_tasks"], row["tasks"])
    return {"result": r, "start": test["start"], "sft": test["SFT"], "rl": test["GRPO"]}


def _cell(t: tuple) -> str:
    return f"{t[0]:.2f} [{t[1]:.2f}, {t[2]:.2f}]"


def run(cfg: DemoConfig, seeds: int, model: Path | None = None, out: Path | None = None,
        first_seed: int = 0, catalog: str = "duckdb") -> pl.DataFrame:
    """Seeds first_seed .. first_seed + seeds - 1 of the recipe; `out` keeps each seed's lake and checkpoints
    (`lake-SEED`, `ckpt-SEED`), so seeds run as separate processes share one folder. `catalog`: the seeds' lakes
    are DuckDB folders, or SQLite catalogs (`lake-SEED.sqlite`), which other processes may write too (GRPO's
    async collectors)."""
    with tempfile.TemporaryDirectory(prefix="trajlake-learning-") as tmp:
        root = out or Path(tmp)
        model = model or build_model(root / "models", cfg.model)
        rows = []
        for seed in range(first_seed, first_seed + seeds):
            t0 = time.perf_counter()
            lake = f"sqlite:{root / f'lake-{seed}.sqlite'}" if catalog == "sqlite" else str(root / f"lake-{seed}")
            s = one_seed(replace(cfg, seed=seed, lake=lake, checkpoints=root / f"ckpt-{seed}", data=None,
                                 progress=False), model)
            r, t = s["result"], s["result"].seconds
            console.print(f"seed {seed}: expert {r.expert_success:.2f}, SFT val by step {r.val_by_step}, plateau "
                          f"step {r.plateau_step}; test start {s['start'][0]:.2f}, SFT {s['sft'][0]:.2f} -> RL "
                          f"{s['rl'][0]:.2f}", soft_wrap=True)
            rows.append({"seed": seed, "expert": round(r.expert_success, 2), "sft_plateau_step": r.plateau_step,
                         "start": _cell(s["start"]), "sft": _cell(s["sft"]), "rl": _cell(s["rl"]),
                         "gain": round(s["rl"][0] - s["sft"][0], 2),
                         "contaminated": max(x[3] or 0 for x in (s["start"], s["sft"], s["rl"])),
                         "test_tasks": s["rl"][4], "demos_s": round(t["demos_s"]), "sft_s": round(t["sft_s"]),
                         "rl_s": round(t["grpo_s"]), "rl_s_per_iteration": round(t["grpo_s_per_iteration"], 1),
                         "seed_s": round(time.perf_counter() - t0)})
    table = pl.DataFrame(rows)
    show(table)
    level = f" d{cfg.difficulty}" if cfg.difficulty is not None else ""
    console.print(f"mean gain of RL over the SFT plateau: {table['gain'].mean():+.2f} over {table.height} seeds "
                  f"({cfg.env}{level}, demonstrations {cfg.expert}, {cfg.eval_tasks} test tasks, greedy; "
                  f"test tasks found in a policy's training lineage: {table['contaminated'].max()})", soft_wrap=True)
    return table


@contextlib.contextmanager
def env_server(env: str, url: str | None, log_dir: Path):
    """`url`, or for agentgym/textcraft without one the URL of AgentGym's real TextCraft server, started here on a
    free port of 127.0.0.1 for the bench's duration; None for a built-in env."""
    if url or not env.startswith("agentgym/"):
        yield url
        return
    if env != "agentgym/textcraft":
        raise TrajlakeError(f"{env} plays a server this bench cannot start: give --env-url URL of a running one")
    from trajlake.collect.envs.agentgym_launch import textcraft_server

    log_dir.mkdir(parents=True, exist_ok=True)
    with textcraft_server(log=log_dir / "textcraft-server.log") as server:
        console.print(f"AgentGym's TextCraft server on {server.url} (log: {log_dir / 'textcraft-server.log'})")
        yield server.url


def train_override(text: str) -> tuple[str, object]:
    """`KEY=VALUE` of --train: VALUE read as a TOML value (2, 0.5, true, "x", [1, 2]), else as a string."""
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"--train takes KEY=VALUE (a GRPO config field), got {text!r}")
    try:
        parsed = tomllib.loads(f"v = {value}")["v"]
    except tomllib.TOMLDecodeError:
        parsed = value
    return key.strip(), parsed


def temperature_list(text: str) -> tuple[float, ...]:
    """--temperatures: comma-separated temperatures (checked as evaluate's sweep checks them), or `none`."""
    if text.strip().lower() == "none":
        return ()
    from trajlake.evaluate.temperature import parse_temperatures

    try:
        return parse_temperatures(text, what="--temperatures")
    except TrajlakeError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    for name in (*CLI_INTS, "max_new_tokens", "demo_samples", "demo_offset", "sft_batch", "sft_patience",
                 "rl_eval_every", "val_tasks"):
        if name != "seed":
            p.add_argument(f"--{name.replace('_', '-')}", type=int, default=None, help=f"override {name}")
    for name in ("expert_noise", "sft_lr", "lr", "temperature"):
        p.add_argument(f"--{name.replace('_', '-')}", type=float, default=None, help=f"override {name}")
    p.add_argument("--temperatures", type=temperature_list, default=None, metavar="T,T,...",
                   help="rollout temperatures swept on val before GRPO (e.g. 0.5,0.7,1.0; 'none': no sweep)")
    p.add_argument("--task-selector", default=None, help="which train tasks GRPO plays: rotation, learnable or a "
                   ".sql file (TrainConfig's rollout.task_selector)")
    p.add_argument("--env", default=DemoConfig.env, help="env played (default doors; agentgym/textcraft: AgentGym's "
                   "real server, with its own defaults)")
    p.add_argument("--env-url", default=None, help="URL of the env's server (default for agentgym/textcraft: start "
                   "AgentGym's real one from ../shared/agentgym)")
    p.add_argument("--template", default=None, help="action template (default plain)")
    p.add_argument("--demos-from", type=Path, default=None, help="demonstrations from a trajectory file (OpenManus-RL "
                   "/ AgentGym parquet, e.g. ../shared/data/agentgym/textcraft/train.parquet) instead of the noisy "
                   "demonstrator, restricted to goals outside the held-out tasks")
    p.add_argument("--advantage", default=None, help="advantage estimator (default grpo)")
    for name in TRAIN_FLOATS:
        p.add_argument(f"--{name.replace('_', '-')}", type=float, default=None, help=f"GRPO {name}")
    p.add_argument("--reward-spec", default=None, help="the spec GRPO trains on (default: the default spec)")
    p.add_argument("--train", type=train_override, action="append", default=[], metavar="KEY=VALUE",
                   help="any other GRPO config field (repeatable), e.g. horizon_start=2")
    p.add_argument("--sft", type=train_override, action="append", default=[], metavar="KEY=VALUE",
                   help="any SFT config field (repeatable), e.g. weight_decay=0.01")
    p.add_argument("--seeds", type=int, default=3, help="how many seeds (default 3)")
    p.add_argument("--first-seed", type=int, default=0, help="the first seed (default 0): seeds run in parallel "
                   "as processes with --first-seed 0, 1, 2 and --seeds 1, sharing --out")
    p.add_argument("--model", default="tiny", help="tiny (default, built), smollm2 (make setup-smollm2 first), or "
                   "the folder of a model")
    p.add_argument("--catalog", choices=("duckdb", "sqlite"), default="duckdb", help="each seed's lake: a DuckDB "
                   "folder (default) or a SQLite catalog, which other processes may write too (--train "
                   "async_collectors=N needs one)")
    p.add_argument("--out", type=Path, default=None, help="keep each seed's lake and checkpoints in this folder "
                   "(default: a temporary folder, removed)")
    args = vars(p.parse_args(argv))
    seeds, out, url, model = args.pop("seeds"), args.pop("out"), args.pop("env_url"), args.pop("model")
    first_seed, catalog = args.pop("first_seed"), args.pop("catalog")
    folder = Path(model) if (Path(model) / "config.json").is_file() else None
    if folder is None:
        args["model"] = model  # a name DemoConfig checks
    grpo = {k: args.pop(k) for k in (*TRAIN_FLOATS, "reward_spec") if args[k] is not None}
    grpo.update(args.pop("train"))
    sft = dict(args.pop("sft"))
    chosen = {k: v for k, v in args.items() if v is not None and k not in (*TRAIN_FLOATS, "reward_spec")}
    textcraft = args["env"] == "agentgym/textcraft"
    layers = [TEXTCRAFT, TEXTCRAFT_SMOLLM2 if model == "smollm2" else {}] if textcraft else []
    stop_cleanly_on_sigterm()  # a killed bench stops the TextCraft server it started
    try:
        if seeds < 1 or first_seed < 0:
            raise TrajlakeError(f"seeds must be >= 1 and first-seed >= 0, got {seeds} and {first_seed}")
        logs = out or Path("reports") / "learning"
        with env_server(args["env"], url, logs) as server:
            cfg = DemoConfig(**layered(*layers, chosen, {"sft": sft, "grpo": grpo, "env_url": server}))
            run(cfg, seeds, folder, out, first_seed, catalog)
    except TrajlakeError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
