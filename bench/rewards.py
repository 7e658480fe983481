"""Rewards throughput: a reward spec compiled to SQL vs a per-trajectory Python loop, same data, same spec.

    python bench/rewards.py [--turns 1000000] [--turns-per-episode 10] [--python-turns N] [--threads N]

Builds a synthetic lake (episodes of `--turns-per-episode` turns, every turn with 10-60 prompt and 10-60
response token ids, action texts of which about half match the format pattern, step rewards, info JSON
with a score) in a temp dir, appended in a few big Arrow batches, then computes the same spec
(goal + format + length_penalty + env_reward + sql, discounted allocation) two ways:

* query: `rewards.score.score` (the compiled query over the pinned snapshot, the NaN/inf check, and storing
  episode_rewards in a new snapshot), then the token allocation from the `reward_spans` view (one row per
  agent segment: first position, length, the reward of each of its tokens; the `token_rewards` view is its
  exact expansion, one row per token), reduced in SQL to per-episode (sum of rewards, token count) for
  every episode. Everything the query side does is inside its timing: reading the parquet files of the
  lake, computing, writing the results. Reported apart, not in the ratio: the same reduction through the
  per-token view (checked equal), fetching every span into Arrow, and writing every token reward to parquet.
* python: OpenManus-RL's way (RewardComposer.compute_total_reward, then the allocation loop over agent
  segments), i.e. `episode_reward` and `allocate` of tests/reward_reference.py (a dict entry per
  token) called once per trajectory; and the same loop with the seed's own allocation code (a zero tensor
  per trajectory, one slice assignment per segment). Its input rows are first read from the same lake
  snapshot into Python (Arrow -> dicts and lists, grouped by episode): that load is timed separately and
  reported, and the ratio is given both without it (loop only, the fairest to Python) and with it.

With `--python-turns N` smaller than `--turns`, the Python side loads and loops over the first N turns'
episodes only, and its times are extrapolated linearly to all turns (the output says so). The two sides'
results are then compared for the episodes both computed: totals and components per episode, and per
episode the allocation's sum and number of rewarded tokens.
"""

from __future__ import annotations

import argparse
import importlib.util
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


def reward_reference():
    """tests/reward_reference.py, the plain-Python oracle the tests hold the compiled queries to (the benchmark is a
    script beside the tests, not a package, so the file is loaded by its path)."""
    path = Path(__file__).resolve().parents[1] / "tests" / "reward_reference.py"
    spec = importlib.util.spec_from_file_location("reward_reference", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


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
SPANS_PER_EPISODE = """
SELECT episode_id, sum(reward * length) AS reward_sum, sum(length) AS tokens
FROM reward_spans WHERE spec_id = ? GROUP BY episode_id
"""
TOKENS_PER_EPISODE = """
SELECT episode_id, sum(reward) AS reward_sum, count(*) AS tokens
FROM token_rewards WHERE spec_id = ? GROUP BY episode_id
"""


def query_side(lake, spec, snapshot: int, out_dir: Path, write_parquet: bool) -> dict:
    from trajlake.rewards.score import score

    t0, c0 = time.perf_counter(), time.process_time()
    result = score(lake, spec, snapshot=snapshot)
    t_score = time.perf_counter() - t0
    # the allocation, run-length encoded: every agent segment's span (first position, length, per-token
    # reward) is computed; the per-token rows are their exact expansion (the token_rewards view)
    t0 = time.perf_counter()
    alloc = lake.query(SPANS_PER_EPISODE, [spec.spec_id], output="arrow")
    t_alloc = time.perf_counter() - t0
    out = {"result": result, "score_s": t_score, "alloc_s": t_alloc, "alloc": alloc,
           "cpu_s": time.process_time() - c0}
    # not in the ratio: the same through the per-token view (one row per rewarded token), and the whole
    # span relation fetched into Arrow (what a trainer reads)
    t0 = time.perf_counter()
    out["tokens_alloc"] = lake.query(TOKENS_PER_EPISODE, [spec.spec_id], output="arrow")
    out["tokens_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    spans = lake.query("SELECT episode_id, turn, position, length, reward FROM reward_spans WHERE spec_id = ?",
                       [spec.spec_id], output="arrow")
    out["spans_s"], out["spans_rows"] = time.perf_counter() - t0, spans.num_rows
    del spans
    if write_parquet:
        path = out_dir / "token_rewards.parquet"
        t0 = time.perf_counter()
        lake.query(f"COPY (SELECT * FROM token_rewards WHERE spec_id = '{spec.spec_id}') TO '{path}' "
                   "(FORMAT parquet)")
        out["parquet_s"] = time.perf_counter() - t0
        out["parquet_rows"] = lake.query(f"SELECT count(*) AS n FROM read_parquet('{path}')")["n"][0]
        out["parquet_mb"] = path.stat().st_size / 2**20
    return out


def same_allocation(spans: pa.Table, tokens: pa.Table) -> float:
    """The per-episode (sum, count) of reward_spans and of token_rewards agree; returns the max |sum diff|."""
    a = {r["episode_id"]: (r["reward_sum"], r["tokens"]) for r in spans.to_pylist()}
    b = {r["episode_id"]: (r["reward_sum"], r["tokens"]) for r in tokens.to_pylist()}
    if a.keys() != b.keys() or any(a[k][1] != b[k][1] for k in a):
        raise SystemExit("MISMATCH between reward_spans and token_rewards (episodes or token counts)")
    worst = max((abs(a[k][0] - b[k][0]) for k in a), default=0.0)
    if any(not math.isclose(a[k][0], b[k][0], rel_tol=1e-9, abs_tol=1e-9) for k in a):
        raise SystemExit(f"MISMATCH between reward_spans and token_rewards sums (max |diff| {worst})")
    return worst


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


def python_side(spec, data: list[tuple[dict, list[dict]]]) -> tuple[float, float, float, dict]:
    """OpenManus-RL style: per trajectory, the composed reward, then the allocation over its tokens.

    Returns (loop time, of which summarising each allocation for the check, the loop's CPU time without
    that summary (pro rata), per-episode results)."""
    reference = reward_reference()

    custom = {"sql": sql_component}
    strategy, gamma = spec.allocation.strategy, spec.allocation.gamma
    out = {}
    summary_s = 0.0
    t0, c0 = time.perf_counter(), time.process_time()
    for ep, turns in data:
        total, comps = reference.episode_reward(spec, ep, turns, custom)
        alloc = reference.allocate(strategy, gamma, total, turns)
        t1 = time.perf_counter()  # the check's summary of each allocation is no part of the seed's work
        out[ep["episode_id"]] = (total, comps, math.fsum(alloc.values()), len(alloc))
        summary_s += time.perf_counter() - t1
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    return wall, summary_s, cpu - summary_s * cpu / wall, out


def seed_allocate(strategy: str, gamma: float, total: float, turns: list[dict]):
    """OpenManus-RL's own allocation code (`_convert_rollout_results_to_dataproto`): the agent segments' (start,
    end) in the full sequence, a zero tensor of its length, one slice assignment per segment. The seed's
    tensor is float32; float64 here, so the result can be checked to 1e-9 (the speed is the same)."""
    import torch

    segments, pos = [], 0
    for t in turns:
        pos += len(t.get("prompt_token_ids") or [])
        n = len(t.get("response_token_ids") or [])
        if n:
            segments.append((pos, pos + n - 1))
        pos += n
    rewards = torch.zeros(pos, dtype=torch.float64)
    if segments:
        if strategy == "last_token":
            rewards[segments[-1][1]] = total
        elif strategy == "uniform_positive":
            if total > 0:
                per_token = total / max(1, sum(e - s + 1 for s, e in segments))
                for s, e in segments:
                    rewards[s:e + 1] = per_token
            elif total < 0:
                rewards[segments[-1][1]] = total
        elif strategy == "discounted":
            current = total
            for s, e in reversed(segments):
                n = e - s + 1
                rewards[s:e + 1] = current / n
                current *= gamma ** n
        else:
            raise KeyError(f"the seed has no {strategy} allocation")
    return rewards


def python_side_seed(spec, data: list[tuple[dict, list[dict]]]) -> tuple[float, dict]:
    """The same loop with the seed's tensor allocation in place of reference.allocate's dict per token."""
    import torch

    reference = reward_reference()

    torch.set_num_threads(1)
    custom = {"sql": sql_component}
    strategy, gamma = spec.allocation.strategy, spec.allocation.gamma
    out = {}
    t0 = time.perf_counter()
    for ep, turns in data:
        total, comps = reference.episode_reward(spec, ep, turns, custom)
        alloc = seed_allocate(strategy, gamma, total, turns)
        out[ep["episode_id"]] = (total, comps, alloc)
    loop_s = time.perf_counter() - t0
    # (not timed) the per-episode (sum, count of non-zero tokens), as the other loop reports them
    out = {k: (t, c, float(a.sum()), int((a != 0).sum())) for k, (t, c, a) in out.items()}
    return loop_s, out


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
        print(f"    reward_spans -> per-episode (sum, count), {rewarded:,} rewarded tokens:           "
              f"{q['alloc_s']:8.2f} s")
        print(f"    total                                                                 {query_s:8.2f} s")
        dtok = same_allocation(q["alloc"], q["tokens_alloc"])
        print(f"    (not in the total: the same per-episode (sum, count) through the per-token view token_rewards: "
              f"{q['tokens_s']:.2f} s, equal (max |diff| {dtok:.1e});")
        print(f"     all {q['spans_rows']:,} spans fetched into Arrow: {q['spans_s']:.2f} s)")
        if "parquet_s" in q:
            print(f"    (separately: every token reward, {q['parquet_rows']:,} rows, to parquet "
                  f"({q['parquet_mb']:.0f} MiB): {q['parquet_s']:.2f} s)")

        # (b) the per-trajectory Python loop
        sample = args.python_turns if args.python_turns and args.python_turns < args.turns else args.turns
        limit = sample // args.turns_per_episode if sample < args.turns else None
        t0 = time.perf_counter()
        data = load_python_inputs(lake, snapshot, limit)
        load_s = time.perf_counter() - t0
        loop_s, summary_s, loop_cpu, py = python_side(spec, data)
        seed_s, py_seed = (python_side_seed(spec, data) if spec.allocation.strategy != "per_turn"
                           else (None, None))
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
              + (f" -> {loop_s * scale:8.2f} s extrapolated" if scale != 1 else "")
              + f" (of which {summary_s:.2f} s summing each allocation for the check)")
        if seed_s is not None:
            print(f"    the same loop with the seed's tensor allocation:           {seed_s:8.2f} s"
                  + (f" -> {seed_s * scale:8.2f} s extrapolated" if scale != 1 else ""))

        n, dt, da = compare(lake, spec, q["alloc"], py)
        print(f"\nequal: {n:,} episodes compared: totals and components (max |diff| {dt:.1e}), allocation "
              f"sum (max |diff| {da:.1e}) and rewarded-token count per episode")
        if py_seed is not None:
            n, dt, da = compare(lake, spec, q["alloc"], py_seed)
            print(f"       and with the seed's tensor allocation (max |diff| {dt:.1e}, {da:.1e})")
        loop_full, load_full = (loop_s - summary_s) * scale, load_s * scale
        print(f"\nspeed-up of the query (score + allocation, {query_s:.2f} s; {q['cpu_s']:.2f} CPU-s on "
              f"{threads} threads) over Python" + (" (extrapolated)" if scale != 1 else "") + ":")
        print(f"    loop only (without the check's sums)   {loop_full:8.2f} s  ->  {loop_full / query_s:6.1f}x")
        if seed_s is not None:
            print(f"    loop only, seed's tensor allocation    {seed_s * scale:8.2f} s  ->  "
                  f"{seed_s * scale / query_s:6.1f}x")
        print(f"    load + loop                            {load_full + loop_full:8.2f} s  ->  "
              f"{(load_full + loop_full) / query_s:6.1f}x")
        print(f"    CPU time, loop only (one thread) {loop_cpu * scale:6.2f} CPU-s vs the query's {q['cpu_s']:.2f} "
              f"CPU-s  ->  {loop_cpu * scale / q['cpu_s']:6.1f}x")
        print(f"(load average at the end: {os.getloadavg()[0]:.1f})")
        lake.close()
    finally:
        if not args.dir:
            shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
