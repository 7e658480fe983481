"""`make rescore`: re-score stored rollouts with a new reward spec and retrain on them, without playing.

The re-score-and-retrain workflow of docs/rewards.md end to end, every number read back from the store:

1. a verbose demonstrator's episodes (`scripted:doors?verbose=0.5`: half its thoughts restate the observation)
   and SFT on them (train/configs/sft-doors-verbose.toml): a policy that replies long or short, succeeding
   either way;
2. that policy's rollouts collected into the store (64 tasks x 4 samples): the data everything below reuses;
3. a new spec, rewards/specs/concise.toml (the default with a tight length penalty), diffed against the
   default on those rollouts;
4. GRPO on the same rollouts under the new spec (train/configs/grpo-doors-concise.toml): no episode played;
   beside it, two comparisons on the same data and steps: the same config under the default spec (the
   control: what retraining alone does), and under the new spec without advantage_floor;
5. every policy evaluated on the same held-out tasks, sampled as it was trained: success and reply tokens.

With several --seeds the whole workflow (demonstrations, SFT, rollouts, retrains, evals) runs once per seed
and a last table gives the mean and spread over them. Run ids carry the prefix and seed, so a second run
only prints the results.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from pathlib import Path

import polars as pl

from trajlake.core.display import console, emit_vertical
from trajlake.core.display import show as show_table
from trajlake.core.errors import TrajlakeError
from trajlake.recipes.entry import add_overrides, check_folders, recipe_args, recipe_parser, run_recipe
from trajlake.rewards import SPECS_DIR
from trajlake.store import Lake

ROLLOUT = dict(env="doors", difficulty=1, max_turns=1, template="think_action", max_new_tokens=96)


@dataclass(frozen=True)
class RescoreConfig:
    """What `python -m trajlake.recipes.rescore` runs; the defaults are `make rescore`'s."""

    lake: str = "lake"
    """Lake URI."""
    models: Path = Path("models")
    """Where the tiny model is built (`<models>/tiny`)."""
    checkpoints: Path = Path("checkpoints")
    """Where the train runs write their checkpoints."""
    demos: int = 256
    """Episodes of the verbose demonstrator (SFT data)."""
    verbose: float = 0.5
    """The demonstrator's share of long thoughts."""
    sft_steps: int = 400
    """SFT steps (mini-batches of 16)."""
    rollout_tasks: int = 64
    """Tasks of the stored rollouts the retrains reuse; `samples` each (a GRPO group)."""
    samples: int = 4
    """Samples per task of the stored rollouts."""
    iterations: int = 8
    """Retrain iterations (16 groups each: two passes over 64 groups)."""
    eval_tasks: int = 200
    """Held-out test tasks each policy is evaluated on (one sample each, temperature 1)."""
    seeds: tuple[int, ...] = (0,)
    """One whole workflow per seed."""
    prefix: str = "rescore"
    """Run id prefix."""
    progress: bool = True
    """Progress bars and stage headings."""

    def __post_init__(self):
        for name in ("demos", "sft_steps", "rollout_tasks", "samples", "iterations", "eval_tasks"):
            if getattr(self, name) < 1:
                raise TrajlakeError(f"rescore: {name} must be >= 1, got {getattr(self, name)}")
        if self.samples < 2:
            raise TrajlakeError("rescore: samples must be >= 2 (GRPO compares a task's samples)")
        if not self.seeds:
            raise TrajlakeError("rescore: give at least one seed")
        if not 0.0 < self.verbose < 1.0:
            raise TrajlakeError(f"rescore: verbose must be between 0 and 1 (exclusive), got {self.verbose}")


#: a reply over this many tokens is a long one: the short "<think>I will open red.</think><action>open red
#: </action>" is about 23 tokens, one whose thought restates the observation about 57
LONG_REPLY = 40
LONG_SQL = """SELECT avg((num_agent_tokens > ?)::INT) FROM episodes WHERE run_id = ? AND status IS DISTINCT FROM
'error'"""

#: the retrains on the stored rollouts: name -> (spec file, config overrides)
RETRAINS = {
    "concise": ("concise.toml", {}),
    "concise, all advantages": ("concise.toml", {"advantage_floor": None}),
    "default (control)": ("default.toml", {}),
}


def _train(cfg: RescoreConfig, lake: Lake, config: str, seed: int, **overrides):
    from trajlake.train.config import CONFIGS_DIR, load_config
    from trajlake.train.loop import train

    tc = load_config(CONFIGS_DIR / config, seed=seed, progress=cfg.progress,
                     checkpoint_dir=str(cfg.checkpoints.absolute()))
    return train(tc.replace(**overrides), lake)


def workflow(cfg: RescoreConfig, lake: Lake, model: Path, seed: int) -> dict[str, str]:
    """Steps 1-4 for one seed; the policy of each stage (`policy:ID`)."""
    from trajlake.collect.config import CollectConfig
    from trajlake.collect.rollout import collect
    from trajlake.rewards import load_spec
    from trajlake.rewards.score import diff

    p = f"{cfg.prefix}-s{seed}"
    log = console.rule if cfg.progress else (lambda *_: None)
    log(f"seed {seed} - 1. the verbose demonstrator's episodes, SFT on them")
    expert = collect(CollectConfig(policy=f"scripted:doors?verbose={cfg.verbose:g}", tokenizer=str(model),
                                   tasks=cfg.demos, seed=seed, run_id=f"{p}-expert", progress=cfg.progress,
                                   **ROLLOUT), lake)
    sft = _train(cfg, lake, "sft-doors-verbose.toml", seed, run_id=f"{p}-sft", model=str(model),
                 sft_steps=cfg.sft_steps, sft_filter=f"run_id = '{expert}' AND success")
    log(f"seed {seed} - 2. the SFT policy's rollouts into the store")
    rollouts = collect(CollectConfig(policy=f"policy:{sft.policy_id}", tasks=cfg.rollout_tasks,
                                     samples=cfg.samples, seed=seed, temperature=1.0, run_id=f"{p}-rollouts",
                                     progress=cfg.progress, concurrency=64, **ROLLOUT), lake)
    where = f"run_id = '{rollouts}'"
    log(f"seed {seed} - 3. rewards diff default concise on them")
    old, new = load_spec(SPECS_DIR / "default.toml"), load_spec(SPECS_DIR / "concise.toml")
    summary, changes = diff(lake, old, new, where=where, top=3)
    if cfg.progress:
        emit_vertical(summary)
        show_table(changes.select("episode_id", "success", "total_a", "total_b", "delta"))
    log(f"seed {seed} - 4. GRPO on the same rollouts, playing nothing: {', '.join(RETRAINS)}")
    stages = {"SFT (played the rollouts)": f"policy:{sft.policy_id}"}
    for i, (name, (spec, overrides)) in enumerate(RETRAINS.items()):
        res = _train(cfg, lake, "grpo-doors-concise.toml", seed, run_id=f"{p}-retrain-{i}",
                     model=f"policy:{sft.policy_id}", train_filter=where, reward_spec=str(SPECS_DIR / spec),
                     iterations=cfg.iterations, **overrides)
        stages[name] = f"policy:{res.policy_id}"
    return stages


def evaluate_stages(cfg: RescoreConfig, lake: Lake, model: Path, stages: dict[str, str], seed: int) -> pl.DataFrame:
    """Step 5: success and reply tokens of each stage's policy on the same held-out tasks, sampled."""
    from trajlake.evaluate.config import EvalConfig
    from trajlake.evaluate.run import evaluate

    ec = EvalConfig(policies=tuple(stages.values()), split="test", tasks=cfg.eval_tasks, temperature=1.0,
                    tokenizer=str(model), seed=seed, progress=cfg.progress, spec=str(SPECS_DIR / "concise.toml"),
                    **ROLLOUT)
    result = evaluate(ec, lake)
    summary = result.summary.filter(pl.col("difficulty") == "all")
    rows = []
    for stage, policy in stages.items():
        r = summary.filter(pl.col("policy") == policy).row(0, named=True)
        long = lake.query(LONG_SQL, [LONG_REPLY, result.runs[policy]]).item()
        rows.append({"seed": seed, "stage": stage, "success": r["success_rate"], "success_low": r["success_low"],
                     "success_high": r["success_high"], "reply_tokens": r["tokens_per_episode"],
                     "long_replies": long, "concise_reward": r["reward_mean"]})
    return pl.DataFrame(rows)


def show(results: pl.DataFrame) -> None:
    table = results.with_columns(
        pl.format("{} [{}, {}]", *(pl.col(c).round(2) for c in ("success", "success_low", "success_high")))
        .alias("success"), pl.col("reply_tokens").round(1), pl.col("long_replies").round(3),
        pl.col("concise_reward").round(3),
    ).drop("success_low", "success_high")
    show_table(table)
    if results["seed"].n_unique() > 1:
        console.print(f"over {results['seed'].n_unique()} seeds (mean, and min to max):")
        show_table(results.group_by("stage", maintain_order=True).agg(
            success=pl.format("{} ({} to {})", pl.col("success").mean().round(3), pl.col("success").min().round(2),
                              pl.col("success").max().round(2)),
            reply_tokens=pl.format("{} ({} to {})", pl.col("reply_tokens").mean().round(1),
                                   pl.col("reply_tokens").min().round(1), pl.col("reply_tokens").max().round(1)),
            long_replies=pl.format("{} ({} to {})", pl.col("long_replies").mean().round(3),
                                   pl.col("long_replies").min().round(2), pl.col("long_replies").max().round(2)),
            concise_reward=pl.col("concise_reward").mean().round(3)))


def run(cfg: RescoreConfig) -> pl.DataFrame:
    from trajlake.recipes.demo import build_model

    t0 = time.perf_counter()
    check_folders(cfg.lake, models=cfg.models, checkpoints=cfg.checkpoints)
    model = build_model(cfg.models, "tiny")
    frames = []
    with Lake.open(cfg.lake) as lake:
        for seed in cfg.seeds:
            stages = workflow(cfg, lake, model, seed)
            if cfg.progress:
                console.rule(f"seed {seed} - 5. every policy on {cfg.eval_tasks} held-out tasks, sampled")
            frames.append(evaluate_stages(cfg, lake, model, stages, seed))
    results = pl.concat(frames)
    console.print("held-out doors tasks (test split, difficulty 1), one sample each at temperature 1, 95% Wilson "
                  "intervals; reply_tokens: agent tokens per episode; concise_reward: the new spec's mean total")
    show(results)
    console.print(f"rescore finished in {time.perf_counter() - t0:.0f} s")
    return results


def main(argv: list[str] | None = None) -> int:
    parser = recipe_parser("trajlake.recipes.rescore", __doc__)
    parser.add_argument("--models", type=Path, default=Path("models"), help="where the tiny model is built")
    parser.add_argument("--checkpoints", type=Path, default=Path("checkpoints"), help="checkpoint folder")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0], help="one workflow per seed (default 0)")
    add_overrides(parser, ("demos", "sft_steps", "rollout_tasks", "iterations", "eval_tasks"))
    parser.add_argument("--prefix", default=None, help="run id prefix (default rescore)")
    args = recipe_args(parser, argv)
    args["seeds"] = tuple(args["seeds"])
    return run_recipe(run, lambda: RescoreConfig(**{k: v for k, v in args.items() if v is not None}))


if __name__ == "__main__":
    sys.exit(main())
