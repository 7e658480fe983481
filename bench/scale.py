"""Cost curves: how each store operation's time and memory grow with the lake, from 100k to 10M turns.

    python bench/scale.py [--turns 100000,1000000,10000000] [--out bench/scale] [--quick] [--json PATH] [--dir DIR]

For each size, a synthetic lake shaped like a real project's is built on a DuckDB-file catalog: episodes of 10 turns
(bench/synthetic.py: 10-60 prompt and 10-60 reply token ids a turn, observation, reply and info texts, step
rewards) over 2,000 tasks (a tenth of them held out), in four collect runs of a scripted policy; a train run whose
100 steps list every collected episode they trained on (`train_steps.episode_ids`, as a real run's lineage); and
an eval run of its last policy on the test tasks and a few train tasks (so the contamination view has something
to find). Then each operation runs in a fresh process of its own, which reports its seconds and the memory it
added at its peak (ru_maxrss after, less the resident size before):

* ingest: the whole lake written by `Lake.append`, in 20 appends at every size (so `maintain` has files to merge at
  each; the synthetic data is made in the same process, untimed, one batch at a time; its arrays are part of the
  peak);
* scan: `Lake.query` of the turns' count and token-list lengths;
* rewards: `score(spans=True)` of the rewards bench's spec (bench/synthetic.py: five components, discounted
  allocation), stored;
* contamination: the `eval_contamination` view (lineage through train_steps, goals, held-out tasks);
* viewer: the served viewer's slowest page of index, a run's first and last part, an episode and a compare page
  (bench/viewer.py's `served_side`, each the median of 3);
* export: `export_dataset` of 10,000 episodes (a `datasets` folder and its parquet file);
* maintain: `Lake.maintain` (flush, merge small files, expire, clean up), last, since it rewrites the files.

The slope of each operation is the least-squares exponent of seconds against turns on log-log axes (1: linear;
an operation whose cost does not depend on the lake's size is near 0). Writes `scale.json` and `scale.svg` (the
curves) to `--out`. Headline rows (`--json`, for make bench): each operation at the largest size against its
time at the smallest size grown linearly (the alternative: "linear growth", computed from the same run), held
to 1x, i.e. met when the operation grows at most linearly.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
from headline import Headline, add_json_option, write_rows
from synthetic import SPEC, synthetic_batch

OPS = ("ingest", "scan", "rewards", "contamination", "viewer", "export", "maintain")
TURNS_PER_EPISODE = 10
TASKS, TEST_SHARE = 2_000, 0.1
COLLECT_RUNS, TRAIN_STEPS = 4, 100
APPENDS = 20  # a lake grows by many writes: the same number of appends at every size, so each has files to merge
EVAL_SHARE = 0.01  # of the episodes: the eval run's
EXPORT_EPISODES = 10_000


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--turns", default="100000,1000000,10000000",
                   help="the lake sizes, in turns, comma-separated (each a multiple of 10)")
    p.add_argument("--out", default="bench/scale", help="where scale.json and scale.svg go")
    p.add_argument("--quick", action="store_true", help="100,000 and 1,000,000 turns (about 2 minutes)")
    p.add_argument("--dir", default=None, help="where to build the lakes (default: a temp dir, removed after)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--child", choices=OPS, help=argparse.SUPPRESS)  # one operation, in this fresh process
    p.add_argument("--lake", help=argparse.SUPPRESS)
    add_json_option(p)
    args = p.parse_args(argv)
    if args.quick:
        args.turns = "100000,1000000"
    try:
        args.sizes = sorted({int(t) for t in args.turns.split(",")})
    except ValueError:
        p.error(f"--turns must be whole numbers separated by commas, got {args.turns!r}")
    if any(n < 10 * TURNS_PER_EPISODE * COLLECT_RUNS or n % TURNS_PER_EPISODE for n in args.sizes):
        least = 10 * TURNS_PER_EPISODE * COLLECT_RUNS
        p.error(f"each size must be a multiple of {TURNS_PER_EPISODE} and at least {least}")
    return args


# ---- the synthetic lake ----------------------------------------------------------------------------------------

def _lineage_rows(episodes: int) -> dict:
    """The runs, policies and tasks of a lake of `episodes` episodes (the first 1 - EVAL_SHARE collected, the rest
    the eval run's)."""
    from trajlake.schemas.records import Policy, Run, Task

    test_from = int(TASKS * (1 - TEST_SHARE))
    runs = [Run(f"collect-{r}", "collect", config={"policy": "scripted"}, status="finished")
            for r in range(COLLECT_RUNS)]
    runs += [Run("train-0", "train", config={"algo": "grpo"}, status="finished"),
             Run("eval-0", "eval", config={"policy": f"train-0/step-{TRAIN_STEPS}"}, status="finished")]
    policies = [Policy("scripted")] + [Policy(f"train-0/step-{s}", run_id="train-0", step=s)
                                       for s in range(1, TRAIN_STEPS + 1)]
    tasks = [Task(f"task-{t:04d}", "synthetic", split="test" if t >= test_from else "train",
                  instruction=f"Goal: reach room {t}.", ground_truth={"room": t}) for t in range(TASKS)]
    return {"runs": runs, "policies": policies, "tasks": tasks}


def _episode_columns(rng: np.random.Generator, idx: np.ndarray, collected: int) -> dict[str, pa.Array]:
    """run, policy, task and group of episodes `idx`: collected ones on train tasks, the eval run's on test tasks
    and, one in twenty, a train task (what the contamination view finds)."""
    test_from = int(TASKS * (1 - TEST_SHARE))
    is_eval = idx >= collected
    task = np.where(is_eval & (rng.random(len(idx)) >= 0.05), rng.integers(test_from, TASKS, len(idx)),
                    rng.integers(0, test_from, len(idx)))
    run = np.where(is_eval, "eval-0", np.char.add("collect-", (idx % COLLECT_RUNS).astype(str)))
    policy = np.where(is_eval, f"train-0/step-{TRAIN_STEPS}", "scripted")
    return {"run_id": pa.array(run.tolist()), "policy_id": pa.array(policy.tolist()),
            "task_id": pa.array([f"task-{t:04d}" for t in task]),
            "group_id": pa.array([f"group-{i // 4}" for i in idx]),
            "sample_index": pa.array((idx % 4).astype(np.int32))}


def _train_steps(collected: int) -> list:
    """The train run's steps: step s trained on the collected episodes whose index is s - 1 modulo TRAIN_STEPS."""
    from trajlake.schemas.records import TrainStep

    return [TrainStep("train-0", s, policy_id=f"train-0/step-{s}", metrics={"loss": 0.0},
                      episode_ids=[f"ep{i:08d}" for i in range(s - 1, collected, TRAIN_STEPS)])
            for s in range(1, TRAIN_STEPS + 1)]


def build(lake, turns: int, seed: int) -> float:
    """Write the synthetic lake of `turns` turns; returns the seconds spent in `Lake.append` alone."""
    rng = np.random.default_rng(seed)
    episodes = turns // TURNS_PER_EPISODE
    collected = episodes - max(1, int(episodes * EVAL_SHARE))
    per_batch = math.ceil(episodes / APPENDS)
    seconds = 0.0
    for first in range(0, episodes, per_batch):
        batch = synthetic_batch(rng, first, min(per_batch, episodes - first), TURNS_PER_EPISODE)
        ep = batch["episodes"]
        for name, values in _episode_columns(rng, np.arange(first, first + ep.num_rows), collected).items():
            ep = ep.append_column(name, values)
        rows = {"episodes": ep, "turns": batch["turns"]}
        if first == 0:
            rows.update(_lineage_rows(episodes))
        if first + per_batch >= episodes:
            rows["train_steps"] = _train_steps(collected)
        t0 = time.perf_counter()
        lake.append(rows, stage="bench", message=f"bench: scale episodes from {first}")
        seconds += time.perf_counter() - t0
    return seconds


# ---- one operation, in its own process -------------------------------------------------------------------------

def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def run_op(op: str, path: str, turns: int, seed: int) -> dict:
    """Run `op` on the lake at `path` in this process: {"seconds", "peak_mb"} (memory added at the op's peak)."""
    from trajlake.store import Lake

    lake = Lake.open(path)
    before = _rss_mb()
    t0 = time.perf_counter()
    if op == "ingest":
        seconds = build(lake, turns, seed)
    else:  # an operation may time its own part (the viewer: its slowest page, without the viewer's start)
        own = OPERATIONS[op](lake, Path(path).parent)
        seconds = own if own is not None else time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    lake.close()
    return {"seconds": round(seconds, 3), "peak_mb": round(max(0.0, peak - before), 1)}


def _scan(lake, _folder: Path) -> None:
    lake.query("SELECT count(*) AS turns, sum(len(prompt_token_ids) + len(response_token_ids)) AS tokens "
               "FROM turns", output="arrow")


def _rewards(lake, _folder: Path) -> None:
    from trajlake.rewards import parse_spec
    from trajlake.rewards.score import score

    result = score(lake, parse_spec(SPEC, source="scale spec"), spans=True)
    assert result.scored > 0


def _contamination(lake, _folder: Path) -> None:
    rows = lake.query("SELECT * FROM eval_contamination")
    assert rows.height >= 1 and rows["episodes"].sum() == lake.count("episodes") - _collected(lake), rows


def _collected(lake) -> int:
    return lake.query("SELECT count(*) FROM episodes WHERE run_id LIKE 'collect-%'").item()


def _viewer(lake, _folder: Path) -> float:
    from viewer import served_side

    return max(served_side(lake, [f"collect-{COLLECT_RUNS - 1}"]).values())


def _export(lake, folder: Path) -> None:
    import datasets

    from trajlake.interop.hf_dataset import export_dataset

    datasets.disable_progress_bars()
    out = folder / "export"
    shutil.rmtree(out, ignore_errors=True)
    n = export_dataset(lake, out, f"episode_id < 'ep{EXPORT_EPISODES:08d}'")
    assert n == min(EXPORT_EPISODES, lake.count("episodes")), n


def _maintain(lake, _folder: Path) -> None:
    lake.maintain()


OPERATIONS = {"scan": _scan, "rewards": _rewards, "contamination": _contamination, "viewer": _viewer,
              "export": _export, "maintain": _maintain}


def measure(op: str, path: Path, turns: int, seed: int) -> dict:
    """`op` in a fresh Python process (so its memory is its own), its result read from its stdout."""
    cmd = [sys.executable, __file__, "--child", op, "--lake", str(path), "--turns", str(turns), "--seed", str(seed)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
    if p.returncode != 0:
        raise SystemExit(f"scale: {op} at {turns:,} turns failed:\n{p.stderr[-3000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


# ---- curves ----------------------------------------------------------------------------------------------------

def slope(sizes: list[int], seconds: list[float]) -> float:
    """The least-squares exponent k of seconds ~ turns^k (log-log)."""
    x, y = np.log(sizes), np.log(np.maximum(seconds, 1e-4))
    return float(np.polyfit(x, y, 1)[0]) if len(sizes) > 1 else math.nan


def plot(results: dict, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = results["sizes"]
    fig, (ax_t, ax_m) = plt.subplots(1, 2, figsize=(11, 4.2))
    for op in OPS:
        rows = results["ops"][op]
        label = f"{op} (slope {slope(sizes, [r['seconds'] for r in rows]):.2f})"
        ax_t.plot(sizes, [r["seconds"] for r in rows], marker="o", label=label)
        ax_m.plot(sizes, [max(r["peak_mb"], 1) for r in rows], marker="o", label=op)
    ax_t.plot(sizes, [results["ops"]["scan"][0]["seconds"] * n / sizes[0] for n in sizes], "k:", label="linear")
    for ax, what in ((ax_t, "seconds"), (ax_m, "memory added at peak (MB)")):
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("turns in the lake")
        ax.set_ylabel(what)
        ax.grid(True, which="both", alpha=0.3)
    ax_t.legend(fontsize=7)
    ax_m.legend(fontsize=7)
    fig.suptitle(f"trajlake store operations against lake size ({results['machine']})", fontsize=9)
    fig.tight_layout()
    fig.savefig(out / "scale.svg")


def headlines(results: dict) -> list[Headline]:
    sizes = results["sizes"]
    small, large = sizes[0], sizes[-1]
    rows = []
    for op in OPS:
        first, last = results["ops"][op][0], results["ops"][op][-1]
        linear = first["seconds"] * large / small
        rows.append(Headline(
            f"scale: {op}, {large:,} turns", f"measured at {large:,} turns",
            f"its {small:,}-turn time grown linearly", last["seconds"], linear, "s", 1.0,
            note=f"slope {slope(sizes, [r['seconds'] for r in results['ops'][op]]):.2f}, "
                 f"peak +{last['peak_mb']:.0f} MB"))
    return rows


def table(results: dict) -> str:
    sizes = results["sizes"]
    head = "| operation | " + " | ".join(f"{n:,} turns" for n in sizes) + " | slope | peak memory added |"
    lines = [head, "|" + "---|" * (len(sizes) + 3)]
    for op in OPS:
        rows = results["ops"][op]
        lines.append(f"| {op} | " + " | ".join(f"{r['seconds']:.2f} s" for r in rows)
                     + f" | {slope(sizes, [r['seconds'] for r in rows]):.2f} | "
                     + ", ".join(f"{r['peak_mb']:.0f}" for r in rows) + " MB |")
    return "\n".join(lines)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.child:
        print(json.dumps(run_op(args.child, args.lake, args.sizes[0], args.seed)))
        return 0
    root = Path(args.dir or tempfile.mkdtemp(prefix="trajlake-scale-"))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    import platform

    results = {"sizes": args.sizes, "ops": {op: [] for op in OPS},
               "machine": f"{os.cpu_count()} cores, {platform.processor() or platform.machine()}",
               "load_before": os.getloadavg()[0]}
    try:
        for n in args.sizes:
            path = root / f"lake-{n}" / "lake"
            shutil.rmtree(path.parent, ignore_errors=True)
            path.parent.mkdir(parents=True)
            for op in OPS:
                got = measure(op, path, n, args.seed)
                results["ops"][op].append(got)
                print(f"scale: {n:>11,} turns  {op:<13} {got['seconds']:8.2f} s  +{got['peak_mb']:.0f} MB",
                      file=sys.stderr, flush=True)
            shutil.rmtree(path.parent, ignore_errors=True)
    finally:
        if args.dir is None:
            shutil.rmtree(root, ignore_errors=True)
    results["load_after"] = os.getloadavg()[0]
    (out / "scale.json").write_text(json.dumps(results, indent=2))
    plot(results, out)
    print(table(results))
    write_rows(args.json, headlines(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
