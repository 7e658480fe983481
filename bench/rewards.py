"""Rewards throughput: recomputing a reward spec over a lake, with its token allocation, in trajlake vs the same spec
as one bare DuckDB query over the lake's parquet files, and vs a per-trajectory Python loop.

    python bench/rewards.py [--turns 1000000] [--repeats 3] [--python-turns N] [--threads N] [--quick] [--json PATH]

Builds a synthetic lake (bench/synthetic.py: 10 turns per episode, 10-60 prompt and 10-60 response token ids per
turn, action texts, step rewards, info JSON) in a temp dir, not timed. Then one spec (goal + format + length_penalty
+ env_reward + sql, discounted allocation) is computed, in the same process, `--repeats` times each:

* trajlake: `rewards.score.score(lake, spec, spans=True)` on a fresh copy of the lake: compile, one query over the
  pinned snapshot that scores every episode and allocates its reward to its agent tokens from the same turns, the
  NaN/inf check, the episode_rewards rows stored in a new snapshot, the allocation returned in Arrow (one span per
  agent segment: position, length, reward of each of its tokens). Its split: the query, and the store write.
* bare, the named baseline: the same spec hand-written as one DuckDB query (`BARE_SQL`) over the lake's data files
  (listed from the catalog with `ducklake_list_files` before the timing), on a plain in-memory DuckDB with the same
  threads: no catalog, no checks, no write; the same per-episode rows and spans, into Arrow.
* view path (the way before `spans=True`, reported, not in a ratio): `score` then the spans read from the
  `reward_spans` view, which reads the stored totals and the turns again.

The sides alternate which goes first between repeats; the medians are reported. Then, not timed: the trajlake spans
equal the view's exactly, the bare query's totals, components and spans equal trajlake's (1e-9), and the Python loop
(bench/rewards_python.py: tests/reward_reference.py's oracle and the seed's tensor allocation, one trajectory at a
time, on rows first read into Python; `--python-turns N`: the first N turns' episodes, extrapolated) equals them
per episode. A mismatch stops the script with a non-zero exit.
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import duckdb
import pyarrow as pa
from headline import Headline, add_json_option, write_rows
from rewards_python import load_python_inputs, python_side, python_side_seed
from synthetic import SPEC, build_lake, synthetic_batch  # noqa: F401 (the viewer's bench imports them from here)

#: SPEC by hand, as someone who knows DuckDB would write it for these files: one window over the turns (each agent
#: segment's start and the agent tokens up to it) on their way to one aggregate per episode (the components'
#: inputs, and the segments as a list), the components, the total, then each segment's discounted reward.
BARE_SQL = """
WITH w AS (
    SELECT episode_id, turn, info, action_text, step_reward, num_response_tokens AS n,
           CAST(sum(num_prompt_tokens + num_response_tokens) OVER upto - num_response_tokens AS BIGINT) AS start,
           CAST(sum(num_response_tokens) OVER upto AS BIGINT) AS upto
    FROM read_parquet($turns) WINDOW upto AS (PARTITION BY episode_id ORDER BY turn ROWS UNBOUNDED PRECEDING)
), agg AS (
    SELECT episode_id, TRY_CAST(json_extract(arg_max_null(info, turn), '$.score') AS DOUBLE) AS last_score,
           avg(CASE WHEN regexp_matches(coalesce(action_text, ''), '<action>.*</action>') THEN 1.0 ELSE 0.0 END) AS fmt,
           arg_max(n, turn) AS last_len, sum(coalesce(step_reward, 0) * pow(0.95, turn)) AS env,
           CAST(sum(n) AS BIGINT) AS agent,
           list({'turn': turn, 'start': start, 'n': n, 'upto': upto}) FILTER (WHERE n > 0) AS segs
    FROM w GROUP BY episode_id
), comps AS (
    SELECT e.episode_id, a.agent, a.segs,
           CASE WHEN e.success THEN 1.0 WHEN e.status = 'ok' AND NOT e.success THEN -1.0
                ELSE coalesce(a.last_score, e.env_reward, 0) END AS c_goal,
           coalesce(a.fmt, 0) AS c_format, -0.01 * greatest(coalesce(a.last_len, 0) - 40, 0) AS c_length_penalty,
           coalesce(a.env, 0) AS c_env_reward, e.num_turns * 0.1 AS c_sql
    FROM read_parquet($episodes) e LEFT JOIN agg a USING (episode_id)
), scored AS (
    SELECT *, 1.0 * c_goal + 0.2 * c_format + 1.0 * c_length_penalty + 0.5 * c_env_reward + 0.5 * c_sql AS total
    FROM comps
)
SELECT episode_id, total, c_goal, c_format, c_length_penalty, c_env_reward, c_sql,
       list_filter(list_transform(segs, s -> {'turn': s.turn, 'position': s.start, 'length': s.n,
                                             'reward': total * pow(0.99, agent - s.upto) / s.n}),
                   s -> s.reward <> 0) AS spans
FROM scored
"""
SPANS_SQL = "SELECT spec_id, episode_id, turn, position, length, reward FROM reward_spans WHERE spec_id = ?"
TARGET = 1 / 1.3  # trajlake at most 1.3x the bare query's time
PYTHON_TARGET = 4.0  # measured 4-7x on the 2-core machine, loop only (bench/README.md)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--turns", type=int, default=None, help="turns in the synthetic lake (1,000,000)")
    p.add_argument("--turns-per-episode", type=int, default=10)
    p.add_argument("--repeats", type=int, default=None, help="timed runs of each side (3)")
    p.add_argument("--python-turns", type=int, default=None,
                   help="turns the Python loop runs over (default: all; --quick 20,000); fewer: extrapolated")
    p.add_argument("--batches", type=int, default=4, help="appends used to build the lake")
    p.add_argument("--threads", type=int, default=0, help="DuckDB threads (0: DuckDB's default, all cores)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dir", default=None, help="where to build the lakes (default: a temp dir, removed after)")
    p.add_argument("--quick", action="store_true", help="the Python loop on 20,000 turns only (about a minute in all)")
    add_json_option(p)
    args = p.parse_args(argv)
    if args.turns is None:
        args.turns = 1_000_000
    if args.repeats is None:
        args.repeats = 3
    if min(args.turns, args.repeats, args.turns_per_episode, args.batches) < 1 or args.turns < args.turns_per_episode:
        p.error("--turns, --repeats, --turns-per-episode and --batches must be at least 1, and --turns at least "
                "--turns-per-episode")
    if args.quick and args.python_turns is None:
        args.python_turns = 20_000
    return args


# ---- the sides ----------------------------------------------------------------------------------------------
def timed_calls(lake, names: tuple[str, ...]) -> dict[str, float]:
    """Wrap the lake's `names` methods to add up their wall time (score's query and its store write)."""
    spent = dict.fromkeys(names, 0.0)
    for name in names:
        method = getattr(lake, name)

        def wrapper(*a, _method=method, _name=name, **kw):
            t0 = time.perf_counter()
            try:
                return _method(*a, **kw)
            finally:
                spent[_name] += time.perf_counter() - t0
        setattr(lake, name, wrapper)
    return spent


def trajlake_side(Lake, path: str, spec, threads: int) -> dict:
    from trajlake.rewards.score import score

    lake = Lake.open(path)
    try:
        if threads:
            lake.query(f"SET threads = {int(threads)}")
        snapshot = lake.current_snapshot()
        spent = timed_calls(lake, ("query", "append"))
        t0, c0 = time.perf_counter(), time.process_time()
        result = score(lake, spec, snapshot=snapshot, spans=True)
        return {"s": time.perf_counter() - t0, "cpu": time.process_time() - c0, "query_s": spent["query"],
                "write_s": spent["append"], "result": result, "spans": result.spans}
    finally:
        lake.close()


def view_side(Lake, path: str, spec, threads: int) -> dict:
    from trajlake.rewards.score import score

    lake = Lake.open(path)
    try:
        if threads:
            lake.query(f"SET threads = {int(threads)}")
        snapshot = lake.current_snapshot()
        t0 = time.perf_counter()
        score(lake, spec, snapshot=snapshot)
        t1 = time.perf_counter()
        spans = lake.query(SPANS_SQL, [spec.spec_id], output="arrow")
        return {"s": time.perf_counter() - t0, "score_s": t1 - t0, "spans_s": time.perf_counter() - t1,
                "spans": spans}
    finally:
        lake.close()


def data_files(lake, table: str) -> list[str]:
    """The parquet files a lake's table is made of now (its catalog's list); a delete file would need applying,
    which the bare query does not do, so there must be none."""
    files = lake.query(f"SELECT data_file, delete_file FROM ducklake_list_files('lake', '{table}')", output="arrow")
    if files["delete_file"].null_count != files.num_rows:
        raise SystemExit(f"{table} has delete files: the bare query reads data files only")
    return files["data_file"].to_pylist()


def bare_side(files: dict[str, list[str]], threads: int) -> dict:
    con = duckdb.connect()
    try:
        if threads:
            con.execute(f"SET threads = {int(threads)}")
        t0, c0 = time.perf_counter(), time.process_time()
        table = con.execute(BARE_SQL, files).to_arrow_table()
        return {"s": time.perf_counter() - t0, "cpu": time.process_time() - c0, "table": table}
    finally:
        con.close()


# ---- the checks -----------------------------------------------------------------------------------------
def check_equal(trajlake: dict, view: pa.Table, bare: pa.Table, stored: pa.Table) -> dict:
    """trajlake's spans are the view's exactly; the bare query's totals, components and spans are trajlake's to
    1e-9 (its sums may run in another order). Returns the largest differences; a mismatch exits."""
    con = duckdb.connect()
    con.register("fused", trajlake["spans"])
    con.register("view", view)
    con.register("bare", bare)
    con.register("stored", stored)
    cols = "spec_id, episode_id, turn, position, length, reward"
    extra = con.execute(f"SELECT (SELECT count(*) FROM (SELECT {cols} FROM fused EXCEPT ALL SELECT {cols} FROM view)) "
                        f"+ (SELECT count(*) FROM (SELECT {cols} FROM view EXCEPT ALL SELECT {cols} FROM fused))"
                        ).fetchone()[0]
    if extra:
        raise SystemExit(f"MISMATCH: {extra} spans differ between score(spans=True) and the reward_spans view")
    totals = con.execute("""
        SELECT count(*), max(abs(b.total - s.total)),
               max(greatest(abs(b.c_goal - s.components['goal']), abs(b.c_format - s.components['format']),
                            abs(b.c_length_penalty - s.components['length_penalty']),
                            abs(b.c_env_reward - s.components['env_reward']), abs(b.c_sql - s.components['sql'])))
        FROM bare b FULL JOIN stored s USING (episode_id)""").fetchone()
    spans = con.execute("""
        WITH b AS (SELECT episode_id, unnest(spans, recursive := true) FROM bare)
        SELECT count(*), count(*) FILTER (WHERE b.position IS DISTINCT FROM f.position
                                           OR b.length IS DISTINCT FROM f.length), max(abs(b.reward - f.reward))
        FROM b FULL JOIN fused f USING (episode_id, turn)""").fetchone()
    con.close()
    if totals[0] != stored.num_rows or not totals[1] <= 1e-9 or not totals[2] <= 1e-9:
        raise SystemExit(f"MISMATCH between the bare query and the stored rewards: {totals}")
    if spans[0] != trajlake["spans"].num_rows or spans[1] or not spans[2] <= 1e-9:
        raise SystemExit(f"MISMATCH between the bare query's spans and trajlake's: {spans}")
    return {"episodes": totals[0], "total_diff": totals[1], "component_diff": totals[2], "spans": spans[0],
            "span_diff": spans[2]}


def per_episode(spans: pa.Table) -> dict[str, tuple[float, int]]:
    """Per episode: (sum of its tokens' rewards, its rewarded tokens), for the Python loop's check."""
    con = duckdb.connect()
    con.register("spans", spans)
    rows = con.execute("SELECT episode_id, sum(reward * length), sum(length) FROM spans GROUP BY ALL").fetchall()
    con.close()
    return {e: (s, int(n)) for e, s, n in rows}


def compare_python(stored: pa.Table, alloc: dict, python: dict) -> tuple[int, float, float]:
    """The Python loop's totals, components and per-episode allocation equal the query's (1e-9); returns
    (episodes compared, max |total or component diff|, max |allocation sum diff|)."""
    q = {r["episode_id"]: (r["total"], dict(r["components"])) for r in stored.to_pylist()}
    max_total = max_alloc = 0.0
    bad = []
    for eid, (total, comps, alloc_sum, n_tokens) in python.items():
        q_total, q_comps = q[eid]
        q_sum, q_n = alloc.get(eid, (0.0, 0))
        pairs = [(q_total, total), *((q_comps[k], v) for k, v in comps.items()), (q_sum, alloc_sum)]
        max_total = max(max_total, *(abs(a - b) for a, b in pairs[:-1]))
        max_alloc = max(max_alloc, abs(q_sum - alloc_sum))
        if q_n != n_tokens or not all(math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9) for a, b in pairs):
            bad.append(eid)
    if bad:
        raise SystemExit(f"MISMATCH between the query and Python on {len(bad)} episodes, e.g. {bad[:5]}")
    return len(python), max_total, max_alloc


# ---- the run ------------------------------------------------------------------------------------------------
def median(runs: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in runs)


def run(args, root: Path) -> list[Headline]:
    from trajlake.rewards import parse_spec
    from trajlake.store import Lake

    spec = parse_spec(SPEC, source="bench spec")
    base = root / "lake"
    lake = Lake.open(str(base))
    t0 = time.perf_counter()
    n_episodes, n_tokens = build_lake(lake, args)
    snapshot = lake.current_snapshot()
    files = {"turns": data_files(lake, "turns"), "episodes": data_files(lake, "episodes")}
    threads = args.threads or lake.query("SELECT current_setting('threads') AS t")["t"][0]
    lake.close()
    print(f"trajlake rewards bench: {args.turns:,} turns ({n_episodes:,} episodes, {n_tokens:,} token ids) built in "
          f"{time.perf_counter() - t0:.1f} s (not timed) in {root}; DuckDB threads {threads}, {os.cpu_count()} "
          f"CPUs, load average {os.getloadavg()[0]:.1f}; spec {spec.name} ({spec.spec_id}): "
          + ", ".join(f"{c.weight:g} x {c.kind}" for c in spec.components)
          + f"; {spec.allocation.strategy} allocation, gamma {spec.allocation.gamma}")
    fused, bare, view = [], [], []
    for i in range(args.repeats):
        copies = [root / f"run{i}-{side}" for side in ("fused", "view")]
        for copy in copies:  # each scoring side scores a lake of its own (scoring stores, and skips what is stored)
            shutil.copytree(base, copy)
        order = ["bare", "fused"] if i % 2 == 0 else ["fused", "bare"]
        for side in order + ["view"]:
            if side == "bare":
                bare.append(bare_side(files, args.threads))
            elif side == "fused":
                fused.append(trajlake_side(Lake, str(copies[0]), spec, args.threads))
            else:
                view.append(view_side(Lake, str(copies[1]), spec, args.threads))
        f, b, v = fused[-1], bare[-1], view[-1]
        print(f"  run {i + 1} ({' then '.join(order)}): trajlake {f['s']:.2f} s (query {f['query_s']:.2f}, store "
              f"write {f['write_s']:.2f}, rest {f['s'] - f['query_s'] - f['write_s']:.2f}; {f['cpu']:.2f} CPU-s) | "
              f"bare {b['s']:.2f} s ({b['cpu']:.2f} CPU-s) | view path {v['s']:.2f} s (score {v['score_s']:.2f} + "
              f"reward_spans {v['spans_s']:.2f}) | load {os.getloadavg()[0]:.1f}")
    lake = Lake.open(str(root / "run0-fused"))  # the view over the totals this side stored, to the last bit
    stored = lake.query("SELECT episode_id, total, components FROM episode_rewards WHERE spec_id = ?",
                        [spec.spec_id], output="arrow")
    eq = check_equal(fused[0], lake.query(SPANS_SQL, [spec.spec_id], output="arrow"), bare[0]["table"], stored)
    print(f"equal: trajlake's {eq['spans']:,} spans are the reward_spans view's exactly; the bare query's "
          f"{eq['episodes']:,} totals and components (max |diff| {max(eq['total_diff'], eq['component_diff']):.1e}) "
          f"and spans (max |diff| {eq['span_diff']:.1e}) equal trajlake's")
    for r in fused:  # score's own Python and Arrow work: splitting off the spans, the components map, the check
        r["rest_s"] = r["s"] - r["query_s"] - r["write_s"]
    t_med, b_med, v_med = median(fused, "s"), median(bare, "s"), median(view, "s")
    q_med, w_med, r_med = median(fused, "query_s"), median(fused, "write_s"), median(fused, "rest_s")
    ratio = t_med / b_med
    print(f"\nmedians of {args.repeats}: trajlake {t_med:.2f} s (query {q_med:.2f} s, store write {w_med:.2f} s, "
          f"the rest {r_med:.2f} s) vs bare {b_med:.2f} s: trajlake takes {ratio:.2f}x the bare "
          f"query's time ({'within' if ratio <= 1.3 else 'OVER'} the 1.3x target; without the store write "
          f"{(t_med - w_med) / b_med:.2f}x); the view path {v_med:.2f} s ({v_med / t_med:.2f}x trajlake's)")

    py = python_rows(args, lake, spec, snapshot, stored, fused[0]["spans"], t_med)
    lake.close()
    split = f"query {q_med:.2f} s, store write {w_med:.2f} s, the rest {r_med:.2f} s (medians)"
    return [
        Headline(f"rewards: recompute + allocation, {args.turns:,} turns", "score(spans=True): one query, stored",
                 "the same spec as one bare DuckDB query over the lake's parquet files", t_med, b_med, "s", TARGET,
                 note=f"median of {args.repeats}; trajlake {split}; without the write {(t_med - w_med) / b_med:.2f}x "
                      "the bare time",
                 extra={"trajlake_runs": [r["s"] for r in fused], "bare_runs": [r["s"] for r in bare],
                        "query_s": q_med, "write_s": w_med, "rest_s": r_med, "view_path_s": v_med,
                        "threads": threads}),
        py,
    ]


def python_rows(args, lake, spec, snapshot: int, stored: pa.Table, spans: pa.Table, t_med: float) -> Headline:
    """The Python loop over the same snapshot, checked against trajlake's results; its headline row."""
    sample = args.python_turns if args.python_turns and args.python_turns < args.turns else args.turns
    limit = sample // args.turns_per_episode if sample < args.turns else None
    t0 = time.perf_counter()
    data = load_python_inputs(lake, snapshot, limit)
    load_s = time.perf_counter() - t0
    loop_s, summary_s, loop_cpu, py = python_side(spec, data)
    seed_s, py_seed = python_side_seed(spec, data)
    scale = args.turns / sum(len(t) for _, t in data)
    del data
    alloc = per_episode(spans)
    n, dt, da = compare_python(stored, alloc, py)
    compare_python(stored, alloc, py_seed)
    loop_full = (loop_s - summary_s) * scale
    how = "all turns" if scale == 1 else f"{len(py):,} episodes, extrapolated x{scale:.1f}"
    print(f"Python per-trajectory loop ({how}): load into Python {load_s * scale:.2f} s, loop {loop_full:.2f} s "
          f"(the seed's tensor allocation {seed_s * scale:.2f} s); equal on {n:,} episodes (max |diff| {dt:.1e}, "
          f"allocation sums {da:.1e}); trajlake is {loop_full / t_med:.1f}x the loop alone, "
          f"{(load_s * scale + loop_full) / t_med:.1f}x load + loop")
    return Headline(f"rewards: recompute + allocation vs a Python loop, {args.turns:,} turns",
                    "score(spans=True)", "per-trajectory Python loop (reference reward + allocation), loop only",
                    t_med, loop_full, "s", PYTHON_TARGET,
                    note=f"Python over {how}; load into Python {load_s * scale:.1f} s more",
                    extra={"seed_loop_s": seed_s * scale, "load_s": load_s * scale, "loop_cpu_s": loop_cpu * scale})


def main(argv=None) -> int:
    args = parse_args(argv)
    root = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="trajlake-bench-rewards-"))
    root.mkdir(parents=True, exist_ok=True)
    try:
        rows = run(args, root)
    finally:
        if not args.dir:
            shutil.rmtree(root, ignore_errors=True)
    for row in rows:
        print(f"headline: {row.stage}: {row.ratio:.2f}x (target {row.target:.2f}, "
              f"{'met' if row.met else 'NOT met'})")
    write_rows(args.json, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
