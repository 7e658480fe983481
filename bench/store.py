"""Store throughput: ingest into the lake (`Lake.append`) vs plain `pyarrow.parquet.write_table`, and a scan back.

    python bench/store.py [--turns 1000000] [--batch 100000] [--turns-per-episode 10] [--lake URI] \\
        [--threads 0] [--seed 0] [--order plain-first|store-first] [--rounds 1] [--quick] [--json PATH]

Generates synthetic episodes and turns (bench/store_data.py: deterministic for a seed, not timed, already in the
store's exact schema, 100-800 prompt ids and 10-60 response ids and logprobs per turn). Then, in this one process,
the same Arrow tables are written two ways, `--batch` turns (whole episodes, with their episode rows) at a time:

* plain, the named baseline: `pyarrow.parquet.write_table` of each batch's turns and episodes to a file of
  its own (pyarrow's defaults: snappy, dictionary encoding, 1M-row row groups);
* store: `Lake.append({"episodes": ..., "turns": ...})` of each batch into a new lake (`--lake`, default a
  DuckDB-file lake in the temp dir): the real store path, i.e. validation and conforming, the insert that
  skips rows whose key is already stored, and one snapshot (catalog commit) per append.

Then the same scan over each side's turns, through `Lake.query` and through DuckDB's `read_parquet` of the
plain files (same DuckDB threads): the row count, every column's non-null count and the summed lengths of
the three token lists (checked equal between the sides, and equal to what was generated).

Reported per side: seconds, rows/s (turns), MB/s of input (the batches' Arrow size), MB on disk and files;
then the ratios store / plain of ingest and scan throughput; the target is 1.0x for both (issue 26).
The sides write to the same disk batch by batch, taking turns at going first (`--order`: the first batch's);
the OS is asked to flush dirty pages (`os.sync`, not timed) before each write, so neither pays for the other's.
`--rounds N` repeats the whole run N times into new folders, the first side alternating, and reports the medians
(a shared machine's load moves single runs by tens of percent).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from headline import Headline, add_json_option, write_rows
from store_data import make_batches

TARGET = 1.0  # issue 26: the store at least as fast as plain parquet, writing and scanning
QUICK_TURNS = 200_000  # --quick: about a minute on 2 busy cores

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
    rounds: int = 1

    def __post_init__(self):
        from trajlake.core.errors import TrajlakeError

        for name in ("turns", "batch", "turns_per_episode", "rounds"):
            if getattr(self, name) < 1:
                raise TrajlakeError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(self, name)}")
        if self.threads < 0:
            raise TrajlakeError(f"--threads must be 0 (DuckDB's default) or more, got {self.threads}")
        if self.order not in ("plain-first", "store-first"):
            raise TrajlakeError(f"--order must be plain-first or store-first, got {self.order!r}")
        if self.rounds > 1 and self.lake:
            raise TrajlakeError("--rounds above 1 writes a new lake each round: leave --lake out")

    @property
    def episodes_per_batch(self) -> int:
        return max(1, self.batch // self.turns_per_episode)


def parse_args(argv=None) -> tuple[StoreBenchConfig, str | None]:
    """The config (sizes and places), and where to write the headline rows."""
    d = StoreBenchConfig()
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--turns", type=int, default=None, help=f"turns written by each side ({d.turns:,})")
    p.add_argument("--batch", type=int, default=d.batch,
                   help="turns per append / per plain file (rounded down to whole episodes)")
    p.add_argument("--turns-per-episode", type=int, default=d.turns_per_episode)
    p.add_argument("--lake", default=None, help="lake URI for the store side, new or empty (default: a temp folder)")
    p.add_argument("--threads", type=int, default=d.threads, help="DuckDB threads (0: DuckDB's default)")
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--order", default=d.order, help="plain-first (default) or store-first: the first batch's")
    p.add_argument("--rounds", type=int, default=None, help="whole runs, the first side alternating (1; --quick 2)")
    p.add_argument("--quick", action="store_true", help=f"{QUICK_TURNS:,} turns, 2 rounds")
    add_json_option(p)
    args = vars(p.parse_args(argv))
    quick, json_path = args.pop("quick"), args.pop("json")
    if args["turns"] is None:
        args["turns"] = QUICK_TURNS if quick else d.turns
    if args["rounds"] is None:
        args["rounds"] = 2 if quick else 1
    return StoreBenchConfig(**args), json_path


# ---- the two sides --------------------------------------------------------------------------------------
def folder_size(path: Path) -> tuple[int, int]:
    """(bytes, files) of the parquet files under `path`."""
    files = [p for p in path.rglob("*.parquet") if p.is_file()]
    return sum(p.stat().st_size for p in files), len(files)


def write_plain(batch: dict[str, pa.Table], folder: Path, i: int) -> tuple[float, float]:
    """Batch `i` as a parquet file per table; (seconds, CPU seconds)."""
    folder.mkdir(parents=True, exist_ok=True)
    t0, c0 = time.perf_counter(), time.process_time()
    for name, table in batch.items():
        pq.write_table(table, folder / f"{name}-{i:05d}.parquet")
    return time.perf_counter() - t0, time.process_time() - c0


def write_store(batch: dict[str, pa.Table], lake, i: int) -> tuple[float, float, int | None]:
    """Batch `i` as one append; (seconds, CPU seconds, the snapshot made)."""
    t0, c0 = time.perf_counter(), time.process_time()
    result = lake.append(batch, stage="bench", run_id="bench-store", message=f"bench: store batch {i}")
    return time.perf_counter() - t0, time.process_time() - c0, result.snapshot_id


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
def median_side(runs: list[dict]) -> dict:
    return {k: statistics.median(r[k] for r in runs) for k in ("seconds", "cpu")}


def report(cfg: StoreBenchConfig, rounds: list[dict], input_bytes: int) -> dict:
    """Print the table (medians over the rounds) and the ratios store / plain; returns the ratios."""
    mb = input_bytes / 2**20
    sides = {n: {**median_side([r["sides"][n] for r in rounds]), **{k: rounds[0]["sides"][n][k]
                                                                     for k in ("bytes", "files")}}
             for n in ("plain", "store")}
    scans = {n: median_side([r["scans"][n] for r in rounds]) for n in ("plain", "store")}
    if len(rounds) > 1:
        print(f"medians of {len(rounds)} rounds:")
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
              "size": sides["store"]["bytes"] / sides["plain"]["bytes"] if sides["plain"]["bytes"] else 0.0,
              "sides": sides, "scans": scans}
    verdict = "meets" if ratios["ingest"] >= TARGET else "is below"
    print(f"ingest ratio, store rows/s / plain write rows/s: {ratios['ingest']:.2f}x ({verdict} the {TARGET}x "
          f"target); in CPU time {ratios['ingest_cpu']:.2f}x")
    verdict = "meets" if ratios["scan"] >= TARGET else "is below"
    print(f"scan ratio, Lake.query rows/s / read_parquet rows/s: {ratios['scan']:.2f}x ({verdict} the {TARGET}x "
          "target)")
    print(f"size ratio, store disk MB / plain disk MB: {ratios['size']:.2f}x")
    return ratios


def headlines(cfg: StoreBenchConfig, ratios: dict) -> list[Headline]:
    sides, scans, n = ratios["sides"], ratios["scans"], f"{cfg.turns:,} turns"
    rounds = f"median of {cfg.rounds} rounds, the order alternating" if cfg.rounds > 1 else "one round"
    return [
        Headline(f"store: ingest {n} in appends of {cfg.episodes_per_batch * cfg.turns_per_episode:,}",
                 "Lake.append (validate, key check, one snapshot each)", "pyarrow.parquet.write_table",
                 sides["store"]["seconds"], sides["plain"]["seconds"], "s", TARGET,
                 note=f"{rounds}; CPU time {ratios['ingest_cpu']:.2f}x",
                 extra={"store_cpu_s": sides["store"]["cpu"], "plain_cpu_s": sides["plain"]["cpu"],
                        "size_ratio": ratios["size"]}),
        Headline(f"store: scan {n} (counts and token list lengths)", "Lake.query over the lake",
                 "DuckDB read_parquet of the plain files", scans["store"]["seconds"], scans["plain"]["seconds"],
                 "s", TARGET, note=rounds),
    ]


def one_round(cfg: StoreBenchConfig, batches: list, tokens: dict, root: Path, order: list[str]) -> dict:
    """Both sides into new folders under `root`, batch by batch (`order` for the first), then both scans,
    checked against `tokens`."""
    from trajlake.core.errors import TrajlakeError
    from trajlake.store import Lake

    lake = Lake.open(cfg.lake or str(root / "lake"))
    try:
        if lake.count("turns") or lake.count("episodes"):
            raise TrajlakeError(f"--lake {cfg.lake} already holds rows: give a new or empty lake")
        if cfg.threads:
            lake.query(f"SET threads = {int(cfg.threads)}")
        # batch by batch, the sides alternating which writes first: a shared machine's load drifts over the
        # tens of seconds a side takes, and each batch's pair sees about the same load
        sides = {n: {"side": n, "seconds": 0.0, "cpu": 0.0} for n in ("plain", "store")}
        snapshots = set()
        for i, batch in enumerate(batches):
            for side in order if i % 2 == 0 else order[::-1]:
                os.sync()
                if side == "plain":
                    seconds, cpu = write_plain(batch, root / "plain", i)
                else:
                    seconds, cpu, snapshot = write_store(batch, lake, i)
                    snapshots.add(snapshot)
                sides[side]["seconds"] += seconds
                sides[side]["cpu"] += cpu
        sides["store"]["snapshots"] = len(snapshots - {None})
        sides["plain"]["bytes"], sides["plain"]["files"] = folder_size(root / "plain")
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
        return {"sides": sides, "scans": scans, "lake": lake.catalog.raw}
    finally:
        lake.close()


def run(cfg: StoreBenchConfig) -> dict:
    """Both sides and the scans, `cfg.rounds` times; returns the ratios (and prints the table)."""
    import duckdb

    root = Path(tempfile.mkdtemp(prefix="trajlake-bench-store-"))
    try:
        threads = cfg.threads or duckdb.connect().execute("SELECT current_setting('threads')").fetchone()[0]
        t0 = time.perf_counter()
        batches = make_batches(cfg)
        input_bytes = sum(t.nbytes for b in batches for t in b.values())
        tokens = expected_scan(batches)
        print(f"trajlake store bench: {cfg.turns:,} turns ({cfg.turns_per_episode} per episode), "
              f"{len(batches)} appends of up to {cfg.episodes_per_batch * cfg.turns_per_episode:,} turns, "
              f"{tokens['prompt_ids']:,} prompt ids + {tokens['response_ids']:,} response ids and logprobs, "
              f"{input_bytes / 2**20:,.0f} MB of Arrow (generated in {time.perf_counter() - t0:.1f} s, not "
              f"timed); DuckDB threads {threads}, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}; "
              f"{cfg.rounds} round(s), {cfg.order} first")
        rounds = []
        for i in range(cfg.rounds):
            first = cfg.order == "plain-first" if i % 2 == 0 else cfg.order != "plain-first"
            order = ["plain", "store"] if first else ["store", "plain"]
            folder = root / f"round{i}"
            r = one_round(cfg, batches, tokens, folder, order)
            shutil.rmtree(folder, ignore_errors=True)  # a round's files (GBs at 1M turns) go before the next
            rounds.append(r)
            w, sc = r["sides"], r["scans"]
            print(f"  round {i + 1} ({' then '.join(order)}; lake {r['lake']}): write plain "
                  f"{w['plain']['seconds']:.2f} s, store {w['store']['seconds']:.2f} s; scan plain "
                  f"{sc['plain']['seconds']:.2f} s, store {sc['store']['seconds']:.2f} s; load "
                  f"{os.getloadavg()[0]:.1f}")
        print(f"both scans found every row written: {tokens['turns']:,} turns, "
              f"{tokens['prompt_ids'] + tokens['response_ids']:,} token ids; "
              f"{rounds[0]['sides']['store']['snapshots']} snapshots, one per append "
              f"(load average at the end {os.getloadavg()[0]:.1f})")
        return report(cfg, rounds, input_bytes)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main(argv=None) -> int:
    from trajlake.core.errors import TrajlakeError

    try:
        cfg, json_path = parse_args(argv)
        ratios = run(cfg)
    except TrajlakeError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    write_rows(json_path, headlines(cfg, ratios))
    return 0


if __name__ == "__main__":
    sys.exit(main())
