"""One live process per run id, on every catalog: real subprocesses take a run's lease (store/lease.py); a second
one is refused in one line naming the holder while the first lives, takes over a lease whose holder was killed
(SIGKILL), and a lease is released when its holder ends or fails."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from trajlake.cli import main
from trajlake.store import Lake
from trajlake.store import lease as L
from trajlake.store.attach import ALIAS

#: `hold URI RUN`: take the lease, close the lake (a DuckDB-file lake admits one process: the test opens it
#: next), say so, and hold it until stdin closes; `take URI RUN`: take it and give it back at once, or print
#: the refusal as the CLI would (one `error:` line, exit 1)
HELPER = textwrap.dedent("""
    import sys
    from trajlake.store import Lake
    from trajlake.store import lease as L

    mode, uri, run_id = sys.argv[1:4]
    lake = Lake.open(uri)
    try:
        held = L.acquire(lake, run_id, "collect")
    except L.RunLeasedError as e:
        print(f"error: {e}", flush=True)
        sys.exit(1)
    if mode == "take":
        held.release()
        print("took", flush=True)
        sys.exit(0)
    lake.close()
    print("held", flush=True)
    sys.stdin.read()
    with Lake.open(uri) as lake:
        held.lake = lake
        held.release()
    print("released", flush=True)
""")


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}


@pytest.fixture
def helper(tmp_path) -> Path:
    p = tmp_path / "lease_helper.py"
    p.write_text(HELPER)
    return p


def hold(helper: Path, uri: str, run_id: str) -> subprocess.Popen:
    """A real process holding `run_id`'s lease (its lake closed)."""
    p = subprocess.Popen([sys.executable, str(helper), "hold", uri, run_id], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env())
    line = p.stdout.readline().strip()
    assert line == "held", line + p.stderr.read()[-3000:]
    return p


def take(helper: Path, uri: str, run_id: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(helper), "take", uri, run_id], capture_output=True, text=True,
                          env=_env(), timeout=300)


def lease_rows(uri: str) -> list[dict]:
    with Lake.open(uri) as lake:
        return lake.query("SELECT * FROM run_leases ORDER BY run_id").to_dicts()


@pytest.mark.slow  # 6 s per catalog: two processes
def test_a_second_process_is_refused_while_the_first_holds_the_lease(lake_uri, helper):
    first = hold(helper, lake_uri, "r1")
    try:
        second = take(helper, lake_uri, "r1")
        assert second.returncode == 1, second.stdout + second.stderr
        lines = second.stdout.strip().splitlines()
        assert len(lines) == 1 and "Traceback" not in second.stderr, second.stdout + second.stderr
        assert lines[0].startswith(f"error: run r1 is being run by collect process {first.pid} on host "
                                   f"{socket.gethostname()} since "), lines[0]
        assert lines[0].endswith(f"one process per run id; wait for it to end or stop it (kill {first.pid}), "
                                 "then run it again (the same run id resumes it)"), lines[0]
        with Lake.open(lake_uri) as lake:  # and in this process, through the read-only check too
            before = lake.snapshots().height
            with pytest.raises(L.RunLeasedError, match=f"^run r1 is being run by collect process {first.pid}"):
                L.check(lake, "r1")
            with pytest.raises(L.RunLeasedError):
                L.acquire(lake, "r1", "train")
            assert lake.snapshots().height == before, "a refused process wrote to the lake"
            other = L.acquire(lake, "r2", "train")  # another run id is another lease
            other.release()
        assert take(helper, lake_uri, "r1").returncode == 1
    finally:
        first.stdin.close()
        assert first.wait(timeout=300) == 0, first.stderr.read()[-3000:]
    assert first.stdout.read().strip() == "released"
    assert lease_rows(lake_uri) == []  # released on a normal end
    assert take(helper, lake_uri, "r1").stdout.strip() == "took"


@pytest.mark.slow  # 4 s per catalog: a killed process
def test_a_lease_left_by_a_killed_process_is_taken_over(lake_uri, helper):
    first = hold(helper, lake_uri, "r1")
    first.send_signal(signal.SIGKILL)
    assert first.wait(timeout=60) == -signal.SIGKILL
    rows = lease_rows(lake_uri)
    assert [(r["run_id"], r["pid"], r["host"]) for r in rows] == [("r1", first.pid, socket.gethostname())]
    second = take(helper, lake_uri, "r1")  # a real process takes it over
    assert (second.returncode, second.stdout.strip()) == (0, "took"), second.stdout + second.stderr
    first = hold(helper, lake_uri, "r1")
    first.kill()
    first.wait(timeout=60)
    with Lake.open(lake_uri) as lake:
        with L.acquire(lake, "r1", "train") as held:
            assert held.took_over is not None and held.took_over.pid == first.pid
            snaps = lake.snapshots()
            assert snaps["message"][-1] == f"train: lease run r1 to process {os.getpid()} on {socket.gethostname()}"
        assert lake.count("run_leases") == 0


def test_a_reused_pid_is_not_the_holder(lake_uri):
    """A lease whose pid runs, but as a process that started later (the pid was reused), is taken over; one
    whose holder is on another host is not (its processes cannot be seen from here)."""
    with Lake.open(lake_uri) as lake:
        held = L.acquire(lake, "r1", "collect")
        me = held.holder
        lake._transaction(lambda cur: bool(cur.execute(
            f"UPDATE {ALIAS}.run_leases SET process_start = 'another-boot:1' WHERE run_id = 'r1'").fetchone()[0]),
            stage="test", message="test: the holder's pid reused")
        assert not L.is_live(L.holder_of(lake, "r1"))
        again = L.acquire(lake, "r1", "collect")
        assert again.took_over.process_start == "another-boot:1"
        again.release()
        held.release()  # its row was taken over: releasing deletes nothing of the new holder's
        far = L.Holder("elsewhere.example", me.pid, None, "t")
        assert L.is_live(far)


@pytest.mark.slow  # 4 s per catalog: racing processes
def test_concurrent_takers_one_wins(lake_uri, helper):
    """Processes starting at once on one run id: exactly one takes the lease while it is held."""
    if not lake_uri.startswith(("sqlite:", "postgres:")):
        pytest.skip("a DuckDB-file lake admits one process at a time: they cannot race")
    Lake.open(lake_uri).close()  # the catalog made once, not raced
    procs = [subprocess.Popen([sys.executable, str(helper), "hold", lake_uri, "r1"], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env())
             for _ in range(3)]
    firsts = [p.stdout.readline().strip() for p in procs]  # each says whether it holds the lease
    for p in procs:
        p.stdin.close()
        p.wait(timeout=300)
    assert sorted(x.split(":")[0] for x in firsts) == ["error", "error", "held"], firsts
    assert lease_rows(lake_uri) == []


def test_release_on_failure_and_the_release_command(lake_uri, capsys):
    with Lake.open(lake_uri) as lake:
        with pytest.raises(RuntimeError), L.acquire(lake, "r1", "train"):
            raise RuntimeError("the run failed")
        assert lake.count("run_leases") == 0
        L.acquire(lake, "gone", "train")  # as if held on a host that is gone for good
    assert main(["--lake", lake_uri, "lease", "show", "gone"]) == 0
    assert main(["--lake", lake_uri, "lease", "release", "gone"]) == 0
    out = capsys.readouterr().out
    assert f"released the lease of run gone: train process {os.getpid()} on host {socket.gethostname()}" in out
    assert lease_rows(lake_uri) == []
