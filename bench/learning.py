"""Does RL beat imitation? The demo's recipe (SFT to its plateau, then GRPO from it) over several seeds.

    .venv/bin/python bench/learning.py                            # make demo's settings, 3 seeds
    .venv/bin/python bench/learning.py --expert-noise 0.5 --advantage gigpo --seeds 1

Per seed, in a lake of its own: the noisy demonstrator plays `--demos` training tasks of doors difficulty 3;
SFT on its successful episodes, checkpointed every `--sft-every` steps, each checkpoint evaluated greedily on
held-out val tasks, the best being the SFT plateau; GRPO from the plateau; the plateau and the RL policy are
evaluated greedily on the same held-out test tasks. Prints each seed's test success (95% Wilson interval),
the mean gain over seeds, and each stage's time. The recipe is trajlake.demo.recipe: what `make demo` runs.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

import polars as pl

from trajlake.demo import CLI_INTS, DemoConfig, build_model, evaluate_policies, recipe
from trajlake.display import Format, console, emit
from trajlake.errors import TrajlakeError
from trajlake.store import Lake

#: GRPO config fields the bench varies besides the demo's own (DemoConfig.train_overrides)
TRAIN_FLOATS = ("kl_coef", "entropy_coef", "gamma", "clip_high")


def one_seed(cfg: DemoConfig, model: Path) -> dict:
    with Lake.open(cfg.lake) as lake:
        r = recipe(cfg, lake, model)
        summary = evaluate_policies(cfg, lake, list(r.policies.values()), model)
    test = {}
    for stage, policy in r.policies.items():
        row = summary.filter(pl.col("policy") == policy).row(0, named=True)
        test[stage.split(" ")[0]] = (row["success_rate"], row["success_low"], row["success_high"])
    return {"result": r, "sft": test["SFT"], "rl": test["GRPO"]}


def run(cfg: DemoConfig, seeds: int, model: Path | None = None, out: Path | None = None) -> pl.DataFrame:
    """Every seed of the recipe; `out` keeps each seed's lake and checkpoints (`lake-SEED`, `ckpt-SEED`)."""
    with tempfile.TemporaryDirectory(prefix="trajlake-learning-") as tmp:
        root = out or Path(tmp)
        model = model or build_model(root / "models", "tiny")
        rows = []
        for seed in range(seeds):
            s = one_seed(replace(cfg, seed=seed, lake=str(root / f"lake-{seed}"), checkpoints=root / f"ckpt-{seed}",
                                 data=None, progress=False), model)
            r, t = s["result"], s["result"].seconds
            console.print(f"seed {seed}: expert {r.expert_success:.2f}, SFT val by step {r.val_by_step}, plateau "
                          f"step {r.plateau_step}; test SFT {s['sft'][0]:.2f} -> RL {s['rl'][0]:.2f}")
            rows.append({"seed": seed, "expert": round(r.expert_success, 2), "sft_plateau_step": r.plateau_step,
                         "sft": f"{s['sft'][0]:.2f} [{s['sft'][1]:.2f}, {s['sft'][2]:.2f}]",
                         "rl": f"{s['rl'][0]:.2f} [{s['rl'][1]:.2f}, {s['rl'][2]:.2f}]",
                         "gain": round(s["rl"][0] - s["sft"][0], 2), "sft_s": round(t["sft_s"]),
                         "rl_s": round(t["grpo_s"]), "rl_s_per_iteration": round(t["grpo_s_per_iteration"], 1)})
    table = pl.DataFrame(rows)
    emit(table, Format.table, None)
    console.print(f"mean gain of RL over the SFT plateau: {table['gain'].mean():+.2f} over {seeds} seeds "
                  f"({cfg.env} d{cfg.difficulty}, demonstrations {cfg.expert}, {cfg.eval_tasks} test tasks, greedy)")
    return table


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    defaults = DemoConfig()
    for name in CLI_INTS:
        if name != "seed":
            p.add_argument(f"--{name.replace('_', '-')}", type=int, default=getattr(defaults, name))
    for name in ("expert_noise", "sft_lr", "lr", "temperature"):
        p.add_argument(f"--{name.replace('_', '-')}", type=float, default=getattr(defaults, name))
    p.add_argument("--env", default=defaults.env, help="env played (default doors)")
    p.add_argument("--advantage", default=defaults.advantage, help="advantage estimator (default grpo)")
    for name in TRAIN_FLOATS:
        p.add_argument(f"--{name.replace('_', '-')}", type=float, default=None, help=f"GRPO {name}")
    p.add_argument("--reward-spec", default=None, help="the spec GRPO trains on (default: the default spec)")
    p.add_argument("--seeds", type=int, default=3, help="seeds 0..N-1 (default 3)")
    p.add_argument("--model", type=Path, default=None, help="model folder (default: the tiny model, built)")
    p.add_argument("--out", type=Path, default=None, help="keep each seed's lake and checkpoints in this folder "
                   "(default: a temporary folder, removed)")
    args = vars(p.parse_args(argv))
    seeds, model, out = args.pop("seeds"), args.pop("model"), args.pop("out")
    overrides = {k: args.pop(k) for k in (*TRAIN_FLOATS, "reward_spec") if args[k] is not None}
    for k in (*TRAIN_FLOATS, "reward_spec"):
        args.pop(k, None)
    try:
        if seeds < 1:
            raise TrajlakeError(f"seeds must be >= 1, got {seeds}")
        cfg = DemoConfig(**args, train_overrides=overrides)
        run(cfg, seeds, model, out)
    except TrajlakeError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
