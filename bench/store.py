"""Store throughput: ingest into the lake (`Lake.append`) vs plain `pyarrow.parquet.write_table`, and a scan back.

    python bench/store.py [--turns 1000000] [--batch 100000] [--turns-per-episode 10] [--lake URI] \\
        [--threads 0] [--seed 0] [--order plain-first|store-first]

Generates synthetic episodes and turns with numpy (deterministic for a seed; not timed), already in the store's
exact schema (`store.validate.conform` of the `episodes` and `turns` tables): every turn has 100-800 new
prompt token ids and 10-60 response token ids with as many logprobs (token ids drawn from a Zipf-like
distribution over a 151,936-id vocabulary, so they compress about as real ones do), an observation, a reply
text, an action, step reward, info JSON and latency. Then, in this one process, the same Arrow tables are
written two ways, `--batch` turns (whole episodes, with their episode rows) at a time:

* plain, the named baseline: `pyarrow.parquet.write_table` of each batch's turns and episodes to a file of
  its own (pyarrow's defaults: snappy, dictionary encoding, 1M-row row groups);
* store: `Lake.append({"episodes": ..., "turns": ...})` of each batch into a new lake (`--lake`, default a
  DuckDB-file lake in the temp dir): the real store path, i.e. validation and conforming, the insert that
  skips rows whose key is already stored, and one snapshot (catalog commit) per append.

Then the same scan over each side's turns, through `Lake.query` and through DuckDB's `read_parquet` of the
plain files (same DuckDB threads): the row count, every column's non-null count and the summed lengths of
the three token lists (checked equal between the sides, and equal to what was generated).

Reported per side: seconds, rows/s (turns), MB/s of input (the batches' Arrow size), MB on disk and files;
then the ratios store / plain of ingest and scan throughput. The issue's target for ingest is 0.7x.
The sides write to the same disk one after the other (`--order`); the OS is asked to flush dirty pages
(`os.sync`, not timed) before each side, so neither pays for the other's writes.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

VOCAB = 151_936  # Qwen2's vocabulary size
PROMPT_TOKENS = (100, 800)  # new prompt ids per turn, inclusive
RESPONSE_TOKENS = (10, 60)
TARGET = 0.7  # the goal for store ingest / plain write

SCAN = """
SELECT count(*) AS turns,
       count(episode_id) + count(turn) + count(observation) + count(action_text) + count(action) + count(format_ok)
       + count(step_reward) + count(done) + count(info) + count(prompt_token_ids) + count(response_token_ids)
       + count(response_logprobs) + count(latency_ms) + count(num_prompt_tokens) + count(num_response_tokens)
       AS non_null,
       sum(len(prompt_token_ids))::BIGINT AS prompt_ids, sum(len(response_token_ids))::BIGINT AS response_ids,
       sum(len(response_logprobs))::BIGINT AS logprobs
FROM {source}
"""


@dataclass(frozen=True)
class StoreBenchConfig:
    """What one run of the bench writes and where."""

    turns: int = 1_000_000
    batch: int = 100_000  # turns per append (rounded down to whole episodes)
    turns_per_episode: int = 10
    lake: str | None = None  # default: a DuckDB-file lake in the temp dir
    threads: int = 0  # DuckDB threads (0: DuckDB's default, all cores)
    seed: int = 0
    order: str = "plain-first"

    def __post_init__(self):
        from trajlake.core.errors import TrajlakeError

        for name in ("turns", "batch", "turns_per_episode"):
            if getattr(self, name) < 1:
                raise TrajlakeError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(self, name)}")
        if self.threads < 0:
            raise TrajlakeError(f"--threads must be 0 (DuckDB's default) or more, got {self.threads}")
        if self.order not in ("plain-first", "store-first"):
            raise TrajlakeError(f"--order must be plain-first or store-first, got {self.order!r}")

    @property
    def episodes_per_batch(self) -> int:
        return max(1, self.batch // self.turns_per_episode)


def parse_args(argv=None) -> argparse.Namespace:
    d = StoreBenchConfig()
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--turns", type=int, default=d.turns, help="turns written by each side")
    p.add_argument("--batch", type=int, default=d.batch,
                   help="turns per append / per plain file (rounded down to whole episodes)")
    p.add_argument("--turns-per-episode", type=int, default=d.turns_per_episode)
    p.add_argument("--lake", default=None, help="lake URI for the store side, new or empty (default: a temp folder)")
    p.add_argument("--threads", type=int, default=d.threads, help="DuckDB threads (0: DuckDB's default)")
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--order", default=d.order, help="plain-first (default) or store-first")
    return p.parse_args(argv)


# ---- synthetic data -------------------------------------------------------------------------------------
def token_pool(rng: np.random.Generator, n: int = 1 << 22) -> np.ndarray:
    """`n` token ids drawn from a Zipf-like law over the vocabulary (id k about as frequent as 1 / (k + 10)):
    each turn's ids are picked from this pool, which is much faster than drawing each from the law."""
    ranks = np.arange(VOCAB, dtype=np.float64)
    cdf = np.cumsum(1.0 / (ranks + 10.0))
    return np.searchsorted(cdf / cdf[-1], rng.random(n)).astype(np.int32)


def text_pool(rng: np.random.Generator, n: int, low: int, high: int, words: list[str]) -> list[str]:
    return [" ".join(rng.choice(words, int(rng.integers(low, high + 1)))) for _ in range(n)]


WORDS = ("you are in the kitchen hall garden there is a drawer door key box table north south east west "
         "take open close go look inventory craft wood plank stick stone iron nothing happens locked").split()


def id_lists(rng: np.random.Generator, pool: np.ndarray, lengths: np.ndarray) -> pa.ListArray:
    offsets = np.zeros(len(lengths) + 1, np.int32)
    np.cumsum(lengths, out=offsets[1:])
    values = pool[rng.integers(0, len(pool), int(offsets[-1]), dtype=np.int32)]
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(values))


def episode_ids(rng: np.random.Generator, n: int) -> pa.Array:
    """Random UUID-shaped ids, as collect's (uuid5 of run, task and sample): no order to prune a key lookup by."""
    digits = np.frombuffer(b"0123456789abcdef", np.uint8)[rng.integers(0, 16, (n, 36), dtype=np.uint8)]
    digits[:, [8, 13, 18, 23]] = ord("-")
    return pa.array(digits.view("S36").ravel().astype(str))


def synthetic_batch(rng, pools: dict, first_episode: int, episodes: int, tpe: int) -> dict[str, pa.Table]:
    """`episodes` episodes of `tpe` turns each, as the store's exact `episodes` and `turns` schemas."""
    from trajlake.schemas.tables import TABLES
    from trajlake.store.validate import conform

    n = episodes * tpe
    ids = episode_ids(rng, episodes)
    row_episode = np.repeat(np.arange(episodes), tpe)
    prompt_len = rng.integers(PROMPT_TOKENS[0], PROMPT_TOKENS[1] + 1, n)
    response_len = rng.integers(RESPONSE_TOKENS[0], RESPONSE_TOKENS[1] + 1, n)
    response = id_lists(rng, pools["tokens"], response_len)
    logprobs = pa.ListArray.from_arrays(response.offsets, pa.array(
        -rng.exponential(0.4, len(response.values)).astype(np.float32)))
    pick = lambda name, k: pa.array(pools[name]).take(pa.array(rng.integers(0, len(pools[name]), k)))  # noqa: E731
    success = rng.random(episodes) < 0.4
    t0 = datetime(2026, 11, 23, tzinfo=timezone.utc) + timedelta(seconds=first_episode)
    started = pa.array([t0 + timedelta(seconds=i) for i in range(episodes)], pa.timestamp("us", tz="UTC"))
    episodes_t = pa.table({
        "episode_id": ids,
        "run_id": pa.array(["bench-store"] * episodes),
        "policy_id": pa.array(["bench-policy"] * episodes),
        "task_id": pa.array([f"task-{i // 8:08d}" for i in range(first_episode, first_episode + episodes)]),
        "env": pa.array(["synthetic"] * episodes),
        "group_id": pa.array([f"group-{i // 8:08d}" for i in range(first_episode, first_episode + episodes)]),
        "sample_index": pa.array(np.arange(first_episode, first_episode + episodes, dtype=np.int32) % 8),
        "status": pa.array(np.where(success, "success", "failure")),
        "success": pa.array(success),
        "env_reward": pa.array(np.where(success, 1.0, np.round(rng.random(episodes), 3))),
        "num_turns": pa.array(np.full(episodes, tpe, np.int32)),
        "num_agent_tokens": pa.array(np.add.reduceat(response_len, np.arange(0, n, tpe)).astype(np.int32)),
        "started_at": started,
        "finished_at": pc.add(started, pa.scalar(timedelta(seconds=30))),
    })
    last = np.tile(np.arange(tpe) == tpe - 1, episodes)
    turns_t = pa.table({
        "episode_id": ids.take(pa.array(row_episode)),
        "turn": pa.array(np.tile(np.arange(tpe, dtype=np.int32), episodes)),
        # an observation names its episode and turn, so (as in real runs) almost none repeats
        "observation": pc.binary_join_element_wise(
            pick("observations", n), ids.take(pa.array(row_episode)),
            pc.cast(pa.array(np.tile(np.arange(tpe), episodes)), pa.string()), " | "),
        "action_text": pick("replies", n),
        "action": pick("actions", n),
        "format_ok": pa.array(rng.random(n) < 0.8),
        "step_reward": pa.array(np.where(last, success[row_episode].astype(np.float64), 0.0)),
        "done": pa.array(last),
        "info": pick("infos", n),
        "prompt_token_ids": id_lists(rng, pools["tokens"], prompt_len),
        "response_token_ids": response,
        "response_logprobs": logprobs,
        "latency_ms": pa.array(np.round(rng.gamma(2.0, 40.0, n), 2)),
    })
    return {"episodes": conform(episodes_t, TABLES["episodes"]), "turns": conform(turns_t, TABLES["turns"])}


def make_batches(cfg: StoreBenchConfig) -> list[dict[str, pa.Table]]:
    rng = np.random.default_rng(cfg.seed)
    words = list(WORDS)
    pools = {
        "tokens": token_pool(rng),
        "observations": text_pool(rng, 2000, 20, 120, words),
        "replies": ["<think>" + t + "</think><action>" + a + "</action>" for t, a in
                    zip(text_pool(rng, 500, 5, 30, words), text_pool(rng, 500, 2, 5, words), strict=True)],
        "actions": text_pool(rng, 200, 2, 5, words),
        "infos": ['{"valid": true}', '{"valid": false}', '{"score": 0.25, "valid": true}', "{}"],
    }
    n_episodes = -(-cfg.turns // cfg.turns_per_episode)
    batches = []
    for first in range(0, n_episodes, cfg.episodes_per_batch):
        k = min(cfg.episodes_per_batch, n_episodes - first)
        batch = synthetic_batch(rng, pools, first, k, cfg.turns_per_episode)
        extra = (first + k) * cfg.turns_per_episode - cfg.turns  # the last episode may be cut short
        if extra > 0:
            batch = cut_last_episode(batch, extra)
        batches.append(batch)
    return batches


def cut_last_episode(batch: dict[str, pa.Table], extra: int) -> dict[str, pa.Table]:
    """Drop the last `extra` turns (all of the last episode's), so exactly --turns turns are written."""
    from trajlake.schemas.tables import TABLES
    from trajlake.store.validate import conform

    turns = batch["turns"].slice(0, batch["turns"].num_rows - extra)
    last = batch["episodes"].num_rows - 1
    kept = turns.num_rows - pc.sum(pc.equal(turns["episode_id"], batch["episodes"]["episode_id"][last])).as_py()
    n_last = turns.num_rows - kept
    episodes = batch["episodes"]
    cols = {name: episodes[name] for name in episodes.column_names}
    cols["num_turns"] = pa.array(np.append(episodes["num_turns"].to_numpy()[:-1], n_last).astype(np.int32))
    cols["num_agent_tokens"] = pa.array(np.append(
        episodes["num_agent_tokens"].to_numpy()[:-1],
        pc.sum(turns["num_response_tokens"].slice(kept)).as_py() or 0).astype(np.int32))
    return {"episodes": conform(pa.table(cols), TABLES["episodes"]), "turns": turns}


# ---- the two sides --------------------------------------------------------------------------------------
def folder_size(path: Path) -> tuple[int, int]:
    """(bytes, files) of the parquet files under `path`."""
    files = [p for p in path.rglob("*.parquet") if p.is_file()]
    return sum(p.stat().st_size for p in files), len(files)


def write_plain(batches: list[dict[str, pa.Table]], folder: Path) -> dict:
    folder.mkdir(parents=True, exist_ok=True)
    t0, c0 = time.perf_counter(), time.process_time()
    for i, batch in enumerate(batches):
        for name, table in batch.items():
            pq.write_table(table, folder / f"{name}-{i:05d}.parquet")
    seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
    size, files = folder_size(folder)
    return {"side": "plain", "seconds": seconds, "cpu": cpu, "bytes": size, "files": files}


def write_store(batches: list[dict[str, pa.Table]], lake) -> dict:
    t0, c0 = time.perf_counter(), time.process_time()
    snapshots = []
    for i, batch in enumerate(batches):
        result = lake.append(batch, stage="bench", run_id="bench-store", message=f"bench: store batch {i}")
        snapshots.append(result.snapshot_id)
    seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
    return {"side": "store", "seconds": seconds, "cpu": cpu, "snapshots": len(set(snapshots) - {None})}


def scan_store(lake) -> dict:
    t0, c0 = time.perf_counter(), time.process_time()
    row = lake.query(SCAN.format(source="turns")).row(0, named=True)
    return {"seconds": time.perf_counter() - t0, "cpu": time.process_time() - c0, "result": row}


def scan_plain(folder: Path, threads: int) -> dict:
    import duckdb

    con = duckdb.connect()
    try:
        if threads:
            con.execute(f"SET threads = {int(threads)}")
        source = f"read_parquet('{folder / 'turns-*.parquet'}')"
        t0, c0 = time.perf_counter(), time.process_time()
        cur = con.execute(SCAN.format(source=source))
        row = dict(zip([d[0] for d in cur.description], cur.fetchone(), strict=True))
        return {"seconds": time.perf_counter() - t0, "cpu": time.process_time() - c0, "result": row}
    finally:
        con.close()


def expected_scan(batches: list[dict[str, pa.Table]]) -> dict:
    """What the scan must find: computed from the generated tables."""
    out = {"turns": 0, "non_null": 0, "prompt_ids": 0, "response_ids": 0, "logprobs": 0}
    for batch in batches:
        t = batch["turns"]
        out["turns"] += t.num_rows
        out["non_null"] += sum(t.num_rows - t[c].null_count for c in t.column_names)
        for key, col in (("prompt_ids", "prompt_token_ids"), ("response_ids", "response_token_ids"),
                         ("logprobs", "response_logprobs")):
            out[key] += len(pc.list_flatten(t[col]))
    return out


# ---- report ---------------------------------------------------------------------------------------------
def report(cfg: StoreBenchConfig, sides: dict[str, dict], scans: dict[str, dict], input_bytes: int) -> dict:
    """Print the table and the ratios store / plain; returns the ratios."""
    mb = input_bytes / 2**20
    print(f"{'':<13}{'seconds':>9}{'CPU s':>8}{'rows/s':>12}{'MB/s':>9}{'disk MB':>9}{'files':>7}")
    rows = [(f"write {n}", sides[n], mb) for n in ("plain", "store")]
    rows += [(f"scan {n}", scans[n], sides[n]["bytes"] / 2**20) for n in ("plain", "store")]
    for label, r, size in rows:  # MB/s: of the Arrow input when writing, of the files on disk when scanning
        side = sides[label.split()[1]]
        print(f"{label:<13}{r['seconds']:>9.2f}{r['cpu']:>8.2f}{cfg.turns / r['seconds']:>12,.0f}"
              f"{size / r['seconds']:>9.1f}{side['bytes'] / 2**20:>9.1f}{side['files']:>7}")
    ratios = {"ingest": sides["plain"]["seconds"] / sides["store"]["seconds"],
              "ingest_cpu": sides["plain"]["cpu"] / sides["store"]["cpu"],
              "scan": scans["plain"]["seconds"] / scans["store"]["seconds"],
              "size": sides["store"]["bytes"] / sides["plain"]["bytes"]}
    verdict = "meets" if ratios["ingest"] >= TARGET else "is below"
    print(f"ingest ratio, store rows/s / plain write rows/s: {ratios['ingest']:.2f}x ({verdict} the {TARGET}x "
          f"target); in CPU time {ratios['ingest_cpu']:.2f}x")
    print(f"scan ratio, Lake.query rows/s / read_parquet rows/s: {ratios['scan']:.2f}x")
    print(f"size ratio, store disk MB / plain disk MB: {ratios['size']:.2f}x")
    return ratios


def run(cfg: StoreBenchConfig) -> dict:
    """Both sides and the scans; returns the ratios (and prints the table)."""
    from trajlake.core.errors import TrajlakeError
    from trajlake.store import Lake

    root = Path(tempfile.mkdtemp(prefix="trajlake-bench-store-"))
    try:
        lake = Lake.open(cfg.lake or str(root / "lake"))
        try:
            if lake.count("turns") or lake.count("episodes"):
                raise TrajlakeError(f"--lake {cfg.lake} already holds rows: give a new or empty lake")
            if cfg.threads:
                lake.query(f"SET threads = {int(cfg.threads)}")
            threads = lake.query("SELECT current_setting('threads') AS t")["t"][0]
            t0 = time.perf_counter()
            batches = make_batches(cfg)
            input_bytes = sum(t.nbytes for b in batches for t in b.values())
            tokens = expected_scan(batches)
            print(f"trajlake store bench: {cfg.turns:,} turns ({cfg.turns_per_episode} per episode), "
                  f"{len(batches)} appends of up to {cfg.episodes_per_batch * cfg.turns_per_episode:,} turns, "
                  f"{tokens['prompt_ids']:,} prompt ids + {tokens['response_ids']:,} response ids and logprobs, "
                  f"{input_bytes / 2**20:,.0f} MB of Arrow (generated in {time.perf_counter() - t0:.1f} s, not "
                  f"timed); DuckDB threads {threads}, {os.cpu_count()} CPUs, load average "
                  f"{os.getloadavg()[0]:.1f}; lake {lake.catalog.raw}; {cfg.order}")
            sides = {}
            order = ["plain", "store"] if cfg.order == "plain-first" else ["store", "plain"]
            for side in order:
                os.sync()
                if side == "plain":
                    sides["plain"] = write_plain(batches, root / "plain")
                else:
                    sides["store"] = write_store(batches, lake)
            if not lake.catalog.remote:
                sides["store"]["bytes"], sides["store"]["files"] = folder_size(Path(lake.catalog.data_path))
            else:
                sides["store"]["bytes"], sides["store"]["files"] = 0, 0
            os.sync()
            scans = {"plain": scan_plain(root / "plain", cfg.threads), "store": scan_store(lake)}
            for name, s in scans.items():
                if s["result"] != tokens:
                    raise TrajlakeError(f"{name} scan found {s['result']}, but {tokens} were written")
            if sides["store"]["snapshots"] != len(batches):
                raise TrajlakeError(f"{sides['store']['snapshots']} snapshots for {len(batches)} appends")
            print(f"both scans found every row written: {tokens['turns']:,} turns, "
                  f"{tokens['prompt_ids'] + tokens['response_ids']:,} token ids; "
                  f"{sides['store']['snapshots']} snapshots, one per append "
                  f"(load average at the end {os.getloadavg()[0]:.1f})")
            return report(cfg, sides, scans, input_bytes)
        finally:
            lake.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main(argv=None) -> int:
    args = parse_args(argv)
    from trajlake.core.errors import TrajlakeError

    try:
        run(StoreBenchConfig(**vars(args)))
    except TrajlakeError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
