"""Concurrent writers: threads sharing one Lake, processes sharing a SQLite or PostgreSQL catalog.

No row may be lost or duplicated, every commit is its own snapshot, and readers running alongside never
see a partial episode. A DuckDB-file catalog admits one process: a second one gets LakeLockedError.
"""

from __future__ import annotations

import json
import select
import subprocess
import sys
import threading

import pytest

from trajlake.schemas import Episode, Turn
from trajlake.store import Lake

TURNS_PER_EPISODE = 2
PARTIAL = (
    "SELECT count(*) AS n FROM episodes e LEFT JOIN turns t USING (episode_id) "
    "GROUP BY e.episode_id, e.num_turns HAVING count(t.turn) != e.num_turns"
)


def episode(eid: str) -> dict:
    return {
        "episodes": [Episode(eid, num_turns=TURNS_PER_EPISODE)],
        "turns": [Turn(eid, t, response_token_ids=(t,)) for t in range(TURNS_PER_EPISODE)],
    }


def assert_all_stored_once(lake: Lake, ids: set[str], stage: str) -> None:
    got = lake.query("SELECT episode_id FROM episodes")["episode_id"].to_list()
    assert len(got) == len(set(got)), "duplicated episodes"
    assert set(got) == ids, f"lost: {sorted(ids - set(got))[:5]}, unexpected: {sorted(set(got) - ids)[:5]}"
    assert lake.count("turns") == TURNS_PER_EPISODE * len(ids)
    dup = lake.query("SELECT count(*) - count(DISTINCT (episode_id, turn)) AS d FROM turns")["d"][0]
    assert dup == 0, "duplicated turns"
    assert lake.query(PARTIAL).is_empty()
    # one snapshot per commit
    snaps = lake.snapshots()
    assert snaps.filter(snaps["stage"] == stage).height == len(ids)


@pytest.mark.slow  # 5 s per catalog: writer threads
def test_threads_share_one_lake(lake):
    writers, commits = 4, 8
    errors: list[BaseException] = []
    snapshot_ids: list[tuple[int, str]] = []  # (snapshot, run id) as each append reported it
    done = threading.Event()
    partial_seen: list = []

    def write(w: int) -> None:
        try:
            for i in range(commits):
                r = lake.append(episode(f"t{w}-{i}"), stage="thread", run_id=f"thread-{w}")
                assert r.inserted == {"episodes": 1, "turns": TURNS_PER_EPISODE}
                snapshot_ids.append((r.snapshot_id, f"thread-{w}"))
        except BaseException as e:  # noqa: BLE001 - reported by the main thread
            errors.append(e)

    def read() -> None:
        try:
            while not done.is_set():
                partial = lake.query(PARTIAL)
                if not partial.is_empty():
                    partial_seen.append(partial.rows())
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=write, args=(w,), daemon=True) for w in range(writers)]
    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    done.set()
    reader.join(timeout=60)
    assert not any(t.is_alive() for t in threads + [reader]), "a thread hung"
    assert not errors, errors
    assert not partial_seen, f"a reader saw partial episodes: {partial_seen[:3]}"
    # each append reported its own snapshot, not one another thread committed meanwhile
    assert len({s for s, _ in snapshot_ids}) == writers * commits
    run_of = dict(lake.snapshots().select("snapshot_id", "run_id").rows())
    assert all(run_of[s] == run for s, run in snapshot_ids), [(s, run, run_of[s]) for s, run in snapshot_ids]
    assert_all_stored_once(lake, {f"t{w}-{i}" for w in range(writers) for i in range(commits)}, "thread")


WORKER = """
import sys
from trajlake.schemas import Episode, Turn
from trajlake.store import Lake

uri, worker, commits = sys.argv[1], sys.argv[2], int(sys.argv[3])
lake = Lake.open(uri)
print("ready", flush=True)
sys.stdin.readline()  # wait until every worker is ready, so that they really write at the same time
for i in range(commits):
    eid = f"p{worker}-{i}"
    lake.append({"episodes": [Episode(eid, num_turns=2)], "turns": [Turn(eid, 0, response_token_ids=(0,)),
                 Turn(eid, 1, response_token_ids=(1,))]}, stage="process", run_id=f"worker-{worker}")
print("done", flush=True)
"""


@pytest.mark.slow  # over 8 s on 2 cores: `make test` keeps its 8 minutes
def test_processes_share_a_multi_process_catalog(lake_uri):
    if not lake_uri.startswith(("sqlite:", "postgres:")):
        pytest.skip("a DuckDB-file catalog admits one process (see test_second_process_on_the_same_lake)")
    workers, commits = 3, 20
    Lake.open(lake_uri).close()  # create it first: the workers race only to write
    procs = [
        subprocess.Popen([sys.executable, "-c", WORKER, lake_uri, str(w), str(commits)],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for w in range(workers)
    ]
    try:
        for p in procs:
            ready, _, _ = select.select([p.stdout], [], [], 60)
            line = p.stdout.readline() if ready else ""
            if line.strip() != "ready":
                p.kill()
                raise AssertionError(f"worker did not start: {line!r} {p.communicate()[1][-3000:]}")
        for p in procs:
            p.stdin.write("go\n")
            p.stdin.flush()
        results = [p.communicate(timeout=240) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for p, (out, err) in zip(procs, results, strict=True):
        assert p.returncode == 0 and out.strip().endswith("done"), f"worker failed: {err[-3000:]}"

    with Lake.open(lake_uri) as lake:
        assert_all_stored_once(lake, {f"p{w}-{i}" for w in range(workers) for i in range(commits)}, "process")
        snaps = lake.snapshots()
        per_worker = snaps.filter(snaps["stage"] == "process")["run_id"].value_counts()
        assert sorted(per_worker["count"].to_list()) == [commits] * workers


OPENER = """
import json, sys
from trajlake.schemas import Episode
from trajlake.store import Lake
from trajlake.core.errors import LakeLockedError

try:
    lake = Lake.open(sys.argv[1])
except LakeLockedError as e:
    print(json.dumps({"locked": str(e)}))
else:
    seen = lake.count("episodes")
    lake.append({"episodes": [Episode("from-second")]}, stage="second")
    print(json.dumps({"seen": seen}))
"""


def test_second_process_on_the_same_lake(lake):
    """DuckDB-file: LakeLockedError naming the multi-process catalogs; SQLite/PostgreSQL: both write."""
    lake.append({"episodes": [Episode("from-first")]}, stage="first")
    run = subprocess.run([sys.executable, "-c", OPENER, lake.catalog.raw], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(run.stdout.strip().splitlines()[-1])
    if lake.catalog.backend == "duckdb":
        message = result["locked"]
        assert "sqlite:" in message and "postgres:" in message, message
        assert "another process" in message
        assert lake.count("episodes") == 1  # and the first process carries on
        lake.append({"episodes": [Episode("still-writable")]}, stage="first")
        assert lake.count("episodes") == 2
    else:
        assert result == {"seen": 1}
        assert set(lake.query("SELECT episode_id FROM episodes")["episode_id"].to_list()) == {
            "from-first", "from-second"
        }


def _race_append(uri: str, go, keys: list[str], out) -> None:
    """One racer: open the lake (maybe new), wait for the start, append the shared keys."""
    try:
        lake = Lake.open(uri)
        go.wait(30)
        res = lake.append({"episodes": [Episode(k, run_id="race") for k in keys]}, stage="test", run_id="race")
        lake.close()
        out.put(res.inserted.get("episodes", 0))
    except Exception as e:  # reported to the parent, which fails the test with it
        out.put(f"{type(e).__name__}: {e}")


def _race_open(uri: str, go, out) -> None:
    try:
        go.wait(30)
        Lake.open(uri).close()
        out.put(0)
    except Exception as e:
        out.put(f"{type(e).__name__}: {e}")


def _race(target, args_of, n: int) -> list:
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    go, out = ctx.Event(), ctx.Queue()
    # each racer gets (uri, go, *rest, out): the start event second, the result queue last
    procs = [ctx.Process(target=target, args=(args_of(i)[0], go, *args_of(i)[1:], out)) for i in range(n)]
    for p in procs:
        p.start()
    go.set()
    results = [out.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(30)
    return results


@pytest.mark.slow  # over 8 s on 2 cores: `make test` keeps its 8 minutes
@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_racing_appends_of_the_same_keys_store_each_once(backend, tmp_path, request):
    """N processes released together append the same keys, over several rounds: every key is stored exactly
    once on every multi-process catalog (DuckLake lets concurrent inserts into one table commit side by side;
    the lake's write token makes them conflict, and the loser's retry finds the keys stored)."""
    from tests.conftest import make_uri

    uri = make_uri(backend, tmp_path, request)
    for rnd in range(3):
        keys = [f"r{rnd}-k{i}" for i in range(4)]
        results = _race(_race_append, lambda i, keys=keys: (uri, keys), 4)
        assert all(isinstance(r, int) for r in results), results
        assert sum(results) == len(keys)  # one racer stored them; the others found them stored
        with Lake.open(uri) as lake:
            got = lake.query("SELECT episode_id FROM episodes WHERE run_id = 'race'")["episode_id"].to_list()
        assert sorted(got) == sorted(k for r in range(rnd + 1) for k in (f"r{r}-k{i}" for i in range(4)))


def test_racing_first_opens_of_a_new_postgres_lake_all_succeed(pg_schema, tmp_path):
    from tests.conftest import pg_conninfo

    uri = f"postgres:{pg_conninfo()} metadata_schema={pg_schema} data_path={tmp_path / 'data'}"
    assert _race(_race_open, lambda i: (uri,), 4) == [0, 0, 0, 0]
    with Lake.open(uri) as lake:
        tables = lake.query("SELECT table_name FROM duckdb_tables() WHERE database_name = 'lake'")
        assert tables.height == len(set(tables["table_name"].to_list()))  # each table made once
