"""Crash safety: writers killed with SIGKILL at random moments never leave a partial episode behind.

A writer process appends episodes together with their turns, a chunk per commit, and is killed at a random
moment, again and again. Afterwards the lake opens, every stored episode has all its turns (in every
snapshot), and a retry of everything adds exactly the missing rows.
"""

from __future__ import annotations

import os
import random
import runpy
import select
import signal
import subprocess
import sys
import time

import pytest

from tests.conftest import make_uri
from trajlake.store import Lake


#: the DuckDB-file lake in the fast suite; the multi-process catalogs (several seconds each) in the slow one,
#: which CI runs too
@pytest.fixture(params=["duckdb", pytest.param("sqlite", marks=pytest.mark.slow),
                        pytest.param("postgres", marks=pytest.mark.slow)])
def lake_uri(request, tmp_path) -> str:
    return make_uri(request.param, tmp_path, request)


KILLS = 5
WRITER = '''
"""Append the chunks (episodes + their turns, one commit each) in a shuffled order, skipping stored ones."""
import random
import sys

from trajlake.schemas import Episode, Turn

N_EPISODES, PER_CHUNK = 120, 4


def chunks():
    rng = random.Random(0)
    out = []
    for first in range(0, N_EPISODES, PER_CHUNK):
        episodes, turns = [], []
        for i in range(first, first + PER_CHUNK):
            n = rng.randint(1, 6)  # 4..24 turns a chunk: some commits inlined, some written as parquet
            episodes.append(Episode(f"ep{i:03d}", num_turns=n, status="done"))
            turns += [
                Turn(f"ep{i:03d}", t, observation="x" * rng.randint(0, 200), response_token_ids=tuple(range(t + 1)),
                     response_logprobs=(-0.25,) * (t + 1))
                for t in range(n)
            ]
        out.append((episodes, turns))
    return out


if __name__ == "__main__":
    from trajlake.store import Lake

    uri, seed = sys.argv[1], int(sys.argv[2])
    lake = Lake.open(uri)
    print("ready", flush=True)
    todo = chunks()
    random.Random(seed).shuffle(todo)
    for episodes, turns in todo:
        lake.append({"episodes": episodes, "turns": turns}, stage="collect", run_id=f"writer-{seed}")
    print("done", flush=True)
'''

PARTIAL = """
SELECT e.episode_id, e.num_turns, count(t.turn) AS stored
FROM episodes e LEFT JOIN turns t USING (episode_id)
GROUP BY e.episode_id, e.num_turns
HAVING count(t.turn) != e.num_turns
"""
ORPHAN_TURNS = "SELECT count(*) AS n FROM turns t ANTI JOIN episodes e USING (episode_id)"


def assert_whole(lake: Lake, snapshot: int | None = None) -> None:
    partial = lake.query(PARTIAL, snapshot=snapshot)
    assert partial.is_empty(), f"partial episodes at snapshot {snapshot}: {partial.rows()}"
    assert lake.query(ORPHAN_TURNS, snapshot=snapshot)["n"][0] == 0, f"turns without episode at {snapshot}"
    dup = lake.query(
        "SELECT (SELECT count(*) - count(DISTINCT episode_id) FROM episodes) "
        "+ (SELECT count(*) - count(DISTINCT (episode_id, turn)) FROM turns) AS d",
        snapshot=snapshot,
    )["d"][0]
    assert dup == 0, f"duplicates at snapshot {snapshot}"


def run_and_kill(script: str, uri: str, seed: int, delay: float, after_ready: bool = True) -> bool:
    """Start a writer and SIGKILL it `delay` s after it opened the lake (or after it started, while it
    may still be creating the lake); True when it was killed before it finished."""
    proc = subprocess.Popen(
        [sys.executable, script, uri, str(seed)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        if after_ready:
            ready, _, _ = select.select([proc.stdout], [], [], 60)
            line = proc.stdout.readline() if ready else ""
            if line.strip() != "ready":
                proc.kill()
                raise AssertionError(f"writer did not start: {line!r} {proc.communicate()[1][-3000:]}")
        time.sleep(delay)
        proc.send_signal(signal.SIGKILL)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    if proc.returncode == -signal.SIGKILL:
        return True
    assert proc.returncode == 0, f"writer failed (rc {proc.returncode}): {err[-3000:]}"
    return False


@pytest.mark.slow  # 10 s per catalog: writer processes killed mid-append
def test_sigkilled_writers_leave_no_partial_episode(lake_uri, tmp_path):
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    chunks = runpy.run_path(str(script))["chunks"]()
    all_episodes = [e for eps, _ in chunks for e in eps]
    all_turns = [t for _, turns in chunks for t in turns]

    seed = int.from_bytes(os.urandom(4), "little")
    rng = random.Random(seed)
    # the first writer dies at any moment from its start (importing, creating the lake, writing); the others
    # at a random moment after they opened the lake
    run_and_kill(str(script), lake_uri, 0, rng.uniform(0.2, 1.5), after_ready=False)
    killed = [run_and_kill(str(script), lake_uri, k, rng.uniform(0.0, 0.5)) for k in range(1, KILLS + 1)]
    assert any(killed), f"no writer was killed mid-run (seed {seed})"

    with Lake.open(lake_uri) as lake:
        assert_whole(lake)
        snaps = lake.snapshots()["snapshot_id"].to_list()
        for snap in rng.sample(snaps[2:], min(8, len(snaps) - 2)):  # 0 and 1 predate the data
            assert_whole(lake, snap)
        stored = lake.count("episodes")
        stored_turns = lake.count("turns")
        # a chunk was one commit: all of its episodes are stored, or none
        ids = set(lake.query("SELECT episode_id FROM episodes")["episode_id"].to_list())
        for eps, _ in chunks:
            present = {e.episode_id for e in eps} & ids
            assert present in (set(), {e.episode_id for e in eps}), f"chunk split: {sorted(present)} (seed {seed})"

        retry = lake.append({"episodes": all_episodes, "turns": all_turns}, stage="collect", run_id="retry")
        assert retry.inserted == {"episodes": len(all_episodes) - stored, "turns": len(all_turns) - stored_turns}
        assert lake.count("episodes") == len(all_episodes)
        assert lake.count("turns") == len(all_turns)
        assert_whole(lake)
        again = lake.append({"episodes": all_episodes, "turns": all_turns}, stage="collect", run_id="retry")
        assert again.snapshot_id is None
