"""Rewards throughput: a reward spec compiled to SQL vs a per-trajectory Python loop, same data, same spec.

    python bench/rewards.py [--turns 1000000] [--turns-per-episode 10] [--python-turns N] [--threads N]

Builds a synthetic lake (episodes of `--turns-per-episode` turns, every turn with 10-60 prompt and 10-60
response token ids, action texts of which about half match the format pattern, step rewards, info JSON
with a score) in a temp dir, appended in a few big Arrow batches, then computes the same spec
(goal + format + length_penalty + env_reward + sql, discounted allocation) two ways:

* query: `rewards.score.score` (the compiled query over the pinned snapshot, the NaN/inf check, and storing
  episode_rewards in a new snapshot), then the token allocation from the `token_rewards` view, materialised
  as per-episode (sum of rewards, token count) for every episode, and, separately timed, written in full
  (one row per rewarded token) to a parquet file. Everything the query side does is inside its timing:
  reading the parquet files of the lake, computing, writing the results.
* python: OpenManus-RL's way (RewardComposer.compute_total_reward, then the allocation loop over agent
  segments), i.e. `rewards.reference.episode_reward` and `rewards.reference.allocate` called once per
  trajectory. Its input rows are first read from the same lake snapshot into Python (Arrow -> dicts and
  lists, grouped by episode): that load is timed separately and reported, and the ratio is given both
  without it (loop only, the fairest to Python) and with it.

With `--python-turns N` smaller than `--turns`, the Python side loads and loops over the first N turns'
episodes only, and its times are extrapolated linearly to all turns (the output says so). The two sides'
results are then compared for the episodes both computed: totals and components per episode, and per
episode the allocation's sum and number of rewarded tokens.
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

SPEC = """
name = "bench"

[allocation]
strategy = "discounted"
gamma = 0.99

[[components]]
kind = "goal"
weight = 1.0

[[components]]
kind = "format"
weight = 0.2
pattern = "<action>.*</action>"

[[components]]
kind = "length_penalty"
weight = 1.0
unit = "tokens"
scope = "last"
max = 40
scale = 0.01

[[components]]
kind = "env_reward"
weight = 0.5
discount = 0.95

[[components]]
kind = "sql"
weight = 0.5
expr = "num_turns * 0.1"
"""


def sql_component(ep: dict, turns: list[dict]) -> float:
    """The Python meaning of the spec's `sql` component (the reference cannot run SQL)."""
    return ep["num_turns"] * 0.1


ACTIONS = [
    "<think>the key is in the drawer</think>\n<action>open drawer</action>",
    "<action>go north</action>",
    "I will go north now.",
    "<think>hmm</think> take key",
    "<action>take key from drawer</action> done",
    "look around",
]
OBSERVATIONS = ["You are in a kitchen. There is a drawer.", "You see a key.", "Nothing happens.",
                "The door is locked.", "You are in the hall."]
INFOS = ['{"score": 0.25, "valid": true}', '{"valid": true}', '{"valid": false}', '{"score": 0.5}', "{}", None]


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--turns", type=int, default=1_000_000, help="turns in the synthetic lake")
    p.add_argument("--turns-per-episode", type=int, default=10)
    p.add_argument("--python-turns", type=int, default=None,
                   help="turns the Python loop runs over (default: all); fewer: extrapolated linearly")
    p.add_argument("--batches", type=int, default=4, help="appends used to build the lake")
    p.add_argument("--threads", type=int, default=0, help="DuckDB threads (0: DuckDB's default, all cores)")
    p.add_argument("--no-parquet", action="store_true", help="skip writing every token reward to parquet")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dir", default=None, help="where to build the lake (default: a temp dir, removed after)")
    return p.parse_args(argv)


# ---- synthetic data -------------------------------------------------------------------------------------
def token_lists(rng: np.random.Generator, n: int) -> pa.ListArray:
    lengths = rng.integers(10, 61, n)
    offsets = np.zeros(n + 1, np.int32)
    np.cumsum(lengths, out=offsets[1:])
    values = rng.integers(0, 50_000, int(offsets[-1]), dtype=np.int32)
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(values))


def pick(rng: np.random.Generator, choices: list, n: int, p=None) -> pa.Array:
    return pa.array(choices).take(pa.array(rng.choice(len(choices), n, p=p)))


def synthetic_batch(rng: np.random.Generator, first: int, episodes: int, tpe: int) -> dict[str, pa.Table]:
    ids = pa.array([f"ep{i:08d}" for i in range(first, first + episodes)])
    n = episodes * tpe
    episodes_t = pa.table({
        "episode_id": ids,
        "env": pa.array(["synthetic"] * episodes),
        "status": pick(rng, ["ok", "ok", "ok", "truncated"], episodes),
        "success": pa.array(rng.random(episodes) < 0.4),
        "env_reward": pa.array(np.round(rng.random(episodes), 3)),
        "num_turns": pa.array(np.full(episodes, tpe, np.int32)),
    })
    step = np.where(rng.random(n) < 0.2, np.round(rng.random(n), 2), 0.0)
    turns_t = pa.table({
        "episode_id": ids.take(pa.array(np.repeat(np.arange(episodes), tpe))),
        "turn": pa.array(np.tile(np.arange(tpe, dtype=np.int32), episodes)),
        "observation": pick(rng, OBSERVATIONS, n),
        "action_text": pick(rng, ACTIONS, n),
        "format_ok": pa.array(rng.random(n) < 0.5),
        "step_reward": pa.array(step),
        "done": pa.array(np.tile(np.arange(tpe) == tpe - 1, episodes)),
        "info": pick(rng, INFOS, n),
        "prompt_token_ids": token_lists(rng, n),
        "response_token_ids": token_lists(rng, n),
    })
    return {"episodes": episodes_t, "turns": turns_t}


def build_lake(lake, args) -> tuple[int, int]:
    rng = np.random.default_rng(args.seed)
    n_episodes = args.turns // args.turns_per_episode
    per_batch = math.ceil(n_episodes / args.batches)
    tokens = 0
    for first in range(0, n_episodes, per_batch):
        batch = synthetic_batch(rng, first, min(per_batch, n_episodes - first), args.turns_per_episode)
        tokens += sum(pc.sum(pc.list_value_length(batch["turns"][c])).as_py()
                      for c in ("prompt_token_ids", "response_token_ids"))
        lake.append(batch, stage="bench", message="bench: synthetic episodes")
    return n_episodes, tokens


# ---- the two sides --------------------------------------------------------------------------------------
def query_side(lake, spec, snapshot: int, out_dir: Path, write_parquet: bool) -> dict:
    from trajlake.rewards.score import score

    t0 = time.perf_counter()
    result = score(lake, spec, snapshot=snapshot)
    t_score = time.perf_counter() - t0
    t0 = time.perf_counter()
    alloc = lake.query(
        "SELECT episode_id, sum(reward) AS reward_sum, count(*) AS tokens FROM token_rewards "
        "WHERE spec_id = ? GROUP BY episode_id", [spec.spec_id], output="arrow")
    t_alloc = time.perf_counter() - t0
    out = {"result": result, "score_s": t_score, "alloc_s": t_alloc, "alloc": alloc}
    if write_parquet:
        path = out_dir / "token_rewards.parquet"
        t0 = time.perf_counter()
        lake.query(f"COPY (SELECT * FROM token_rewards WHERE spec_id = '{spec.spec_id}') TO '{path}' "
                   "(FORMAT parquet)")
        out["parquet_s"] = time.perf_counter() - t0
        out["parquet_rows"] = lake.query(f"SELECT count(*) AS n FROM read_parquet('{path}')")["n"][0]
        out["parquet_mb"] = path.stat().st_size / 2**20
    return out


def load_python_inputs(lake, snapshot: int, episode_limit: int | None) -> list[tuple[dict, list[dict]]]:
    """The rows the Python loop needs, read once from the lake snapshot, grouped by episode."""
    cond = f"WHERE episode_id < 'ep{episode_limit:08d}'" if episode_limit is not None else ""
    eps = lake.query(f"SELECT * FROM episodes {cond} ORDER BY episode_id", snapshot=snapshot,
                     output="arrow").to_pylist()
    turns = lake.query(
        "SELECT episode_id, turn, observation, action_text, format_ok, step_reward, info, prompt_token_ids, "
        f"response_token_ids FROM turns {cond} ORDER BY episode_id, turn", snapshot=snapshot,
        output="arrow").to_pylist()
    grouped, i = [], 0
    for ep in eps:
        j = i
        while j < len(turns) and turns[j]["episode_id"] == ep["episode_id"]:
            j += 1
        grouped.append((ep, turns[i:j]))
        i = j
    return grouped


def python_side(spec, data: list[tuple[dict, list[dict]]]) -> tuple[float, dict]:
    """OpenManus-RL style: per trajectory, the composed reward, then the allocation over its tokens."""
    from trajlake.rewards import reference

    custom = {"sql": sql_component}
    strategy, gamma = spec.allocation.strategy, spec.allocation.gamma
    out = {}
    t0 = time.perf_counter()
    for ep, turns in data:
        total, comps = reference.episode_reward(spec, ep, turns, custom)
        alloc = reference.allocate(strategy, gamma, total, turns)
        out[ep["episode_id"]] = (total, comps, math.fsum(alloc.values()), len(alloc))
    return time.perf_counter() - t0, out


def compare(lake, spec, query_alloc: pa.Table, python: dict) -> tuple[int, float, float]:
    """Check the two sides agree; returns (episodes compared, max |total diff|, max |allocation sum diff|)."""
    stored = lake.query("SELECT episode_id, total, components FROM episode_rewards WHERE spec_id = ?",
                        [spec.spec_id], output="arrow").to_pylist()
    q = {r["episode_id"]: (r["total"], dict(r["components"])) for r in stored}
    a = {r["episode_id"]: (r["reward_sum"], r["tokens"]) for r in query_alloc.to_pylist()}
    max_total = max_alloc = 0.0
    bad = []
    for eid, (total, comps, alloc_sum, n_tokens) in python.items():
        q_total, q_comps = q[eid]
        q_sum, q_n = a.get(eid, (0.0, 0))
        max_total = max(max_total, abs(q_total - total), *(abs(q_comps[k] - v) for k, v in comps.items()))
        max_alloc = max(max_alloc, abs(q_sum - alloc_sum))
        if (not math.isclose(q_total, total, rel_tol=1e-9, abs_tol=1e-9) or q_n != n_tokens
                or not math.isclose(q_sum, alloc_sum, rel_tol=1e-9, abs_tol=1e-9)
                or any(not math.isclose(q_comps[k], v, rel_tol=1e-9, abs_tol=1e-9) for k, v in comps.items())):
            bad.append(eid)
    if bad:
        raise SystemExit(f"MISMATCH between query and Python on {len(bad)} episodes, e.g. {bad[:5]}")
    return len(python), max_total, max_alloc


def main(argv=None) -> int:
    args = parse_args(argv)
    import trajlake.rewards  # noqa: F401 (registers the token_rewards view)
    from trajlake.rewards import parse_spec
    from trajlake.store import Lake

    spec = parse_spec(SPEC, source="bench spec")
    root = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="trajlake-bench-rewards-"))
    root.mkdir(parents=True, exist_ok=True)
    try:
        lake = Lake.open(str(root / "lake"))
        if args.threads:
            lake.query(f"SET threads = {int(args.threads)}")
        threads = lake.query("SELECT current_setting('threads') AS t")["t"][0]
        print(f"trajlake rewards bench: {args.turns:,} turns ({args.turns_per_episode} per episode), "
              f"DuckDB threads {threads}, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}, "
              f"lake in {root}")
        t0 = time.perf_counter()
        n_episodes, n_tokens = build_lake(lake, args)
        snapshot = lake.current_snapshot()
        print(f"built the lake: {n_episodes:,} episodes, {args.turns:,} turns, {n_tokens:,} token ids "
              f"in {time.perf_counter() - t0:.1f} s (not timed below); scoring snapshot {snapshot}")
        print(f"spec {spec.name} ({spec.spec_id}): " + ", ".join(f"{c.weight:g} x {c.kind}" for c in spec.components)
              + f"; {spec.allocation.strategy} allocation, gamma {spec.allocation.gamma}")

        # (a) the compiled query
        q = query_side(lake, spec, snapshot, root, not args.no_parquet)
        rewarded = int(np.sum(q["alloc"]["tokens"].to_numpy()))
        query_s = q["score_s"] + q["alloc_s"]
        print(f"\n(a) query, over all {args.turns:,} turns:")
        print(f"    score (compile, run over the lake, check, store {q['result'].scored:,} episode_rewards): "
              f"{q['score_s']:8.2f} s")
        print(f"    token_rewards -> per-episode (sum, count) over {rewarded:,} rewarded tokens:     "
              f"{q['alloc_s']:8.2f} s")
        print(f"    total                                                                 {query_s:8.2f} s")
        if "parquet_s" in q:
            print(f"    (separately: every token reward, {q['parquet_rows']:,} rows, to parquet "
                  f"({q['parquet_mb']:.0f} MiB): {q['parquet_s']:.2f} s)")

        # (b) the per-trajectory Python loop
        sample = args.python_turns if args.python_turns and args.python_turns < args.turns else args.turns
        limit = sample // args.turns_per_episode if sample < args.turns else None
        t0 = time.perf_counter()
        data = load_python_inputs(lake, snapshot, limit)
        load_s = time.perf_counter() - t0
        loop_s, py = python_side(spec, data)
        sample_turns = sum(len(t) for _, t in data)
        scale = args.turns / sample_turns
        del data
        how = (f"all {sample_turns:,} turns" if scale == 1 else
               f"a sample of {sample_turns:,} turns ({len(py):,} episodes), EXTRAPOLATED x{scale:.1f} to "
               f"{args.turns:,} turns")
        print(f"\n(b) Python per-trajectory loop (reference.episode_reward + reference.allocate), {how}:")
        print(f"    load rows into Python (Arrow -> dicts, grouped by episode): {load_s:8.2f} s"
              + (f" -> {load_s * scale:8.2f} s extrapolated" if scale != 1 else ""))
        print(f"    loop over episodes:                                        {loop_s:8.2f} s"
              + (f" -> {loop_s * scale:8.2f} s extrapolated" if scale != 1 else ""))

        n, dt, da = compare(lake, spec, q["alloc"], py)
        print(f"\nequal: {n:,} episodes compared: totals and components (max |diff| {dt:.1e}), allocation "
              f"sum (max |diff| {da:.1e}) and rewarded-token count per episode")
        loop_full, load_full = loop_s * scale, load_s * scale
        print(f"\nspeed-up of the query (score + allocation, {query_s:.2f} s) over Python"
              + (" (extrapolated)" if scale != 1 else "") + ":")
        print(f"    loop only         {loop_full:8.2f} s  ->  {loop_full / query_s:6.1f}x")
        print(f"    load + loop       {load_full + loop_full:8.2f} s  ->  {(load_full + loop_full) / query_s:6.1f}x")
        print(f"(load average at the end: {os.getloadavg()[0]:.1f})")
        lake.close()
    finally:
        if not args.dir:
            shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
