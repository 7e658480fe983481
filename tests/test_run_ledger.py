"""The run ledger (trajlake.store.runs) on every catalog backend: a run begins, resumes only with the settings
it was stored with, and ends finished or failed; which settings identify a run is declared on the config's
fields, and a field added later at its old value changes no stored run and no id."""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from pathlib import Path

import pytest

from trajlake.core.config_types import added_later, id_settings, operational, run_fields
from trajlake.core.errors import TrajlakeError
from trajlake.schemas import Policy, Run
from trajlake.store import runs


@dataclass(frozen=True, kw_only=True)
class Job:
    """A config as a stage declares one: `workers` says how the run is carried out, every other field what the
    run is."""

    name: str
    tags: tuple[str, ...] = ()
    size: int = 1
    workers: int = operational(1, help="Processes that carry the run out.")

    def differences(self, stored: dict) -> list:
        return runs.differences(stored, self)


@dataclass(frozen=True, kw_only=True)
class JobWithDepth(Job):
    """Job after a release that added `depth`: the runs stored before it were made at depth 3."""

    depth: int = added_later(3, help="How deep the job goes.")


def job_run(run_id: str, config: Job, kind: str = "collect") -> Run:
    return Run(run_id, kind, config=asdict(config), status="running", started_at=None)


def test_begin_writes_the_run_with_its_rows_and_reads_it_back(lake):
    config = Job(name="a", tags=("x", "y"))
    res = runs.begin(lake, job_run("r1", config), stage="collect", message="collect: start run r1",
                     rows={"policies": [Policy("p1", run_id="r1")]})
    assert res.inserted == {"runs": 1, "policies": 1}
    snaps = lake.snapshots()
    assert snaps["snapshot_id"][-1] == res.snapshot_id and snaps["message"][-1] == "collect: start run r1"
    run = runs.stored(lake, "r1")
    assert (run.run_id, run.kind, run.status) == ("r1", "collect", "running")
    assert run.config == {"name": "a", "tags": ["x", "y"], "size": 1, "workers": 1}  # a dict on every catalog
    assert runs.stored(lake, "nope") is None
    # the same id again keeps the stored row: nothing is written
    before = lake.snapshots().height
    again = runs.begin(lake, job_run("r1", Job(name="other")), stage="collect")
    assert again.snapshot_id is None and again.skipped == {"runs": 1}
    assert lake.snapshots().height == before and runs.stored(lake, "r1").config["name"] == "a"


def test_a_resume_finds_the_stored_run_and_refuses_other_settings(lake):
    config = Job(name="a", size=2)
    runs.begin(lake, job_run("r1", config), stage="collect")
    before = lake.snapshots().height
    assert runs.find(lake, None, config, kinds=("collect",)) is None  # no id: a new run
    assert runs.find(lake, "r2", config, kinds=("collect",)) is None  # not stored: a new run
    found = runs.find(lake, "r1", Job(name="a", size=2, workers=8), kinds=("collect",))  # operational: resumes
    assert found is not None and found.run_id == "r1"
    with pytest.raises(TrajlakeError) as e:
        runs.find(lake, "r1", Job(name="a", size=3), kinds=("collect",))
    assert str(e.value) == "run r1 already exists with size 2; given 3 (use a new --run-id)"
    with pytest.raises(TrajlakeError) as e:
        runs.find(lake, "r1", Job(name="b", size=3), kinds=("collect",))
    assert str(e.value) == "run r1 already exists with name 'a', size 2; given name 'b', size 3 (use a new --run-id)"
    with pytest.raises(TrajlakeError, match=r"^run r1 already exists as a collect run, not a train run "):
        runs.find(lake, "r1", config, kinds=("train",))
    assert lake.snapshots().height == before, "finding a run wrote to the lake"


def test_restart_finish_and_fail(lake):
    config = Job(name="a")
    runs.begin(lake, job_run("r1", config), stage="train")
    run = runs.stored(lake, "r1")
    assert runs.restart(lake, run, stage="train", config=asdict(config)) is None  # running, same config
    snap = runs.finish(lake, "r1", stage="train")
    assert snap is not None and lake.snapshots()["message"][-1] == "train: run r1 finished"
    run = runs.stored(lake, "r1")
    assert run.status == "finished" and run.finished_at is not None
    # a restart marks it running again, recording the operational settings it now runs with
    assert runs.restart(lake, run, stage="train", config={**asdict(config), "workers": 4}) is not None
    run = runs.stored(lake, "r1")
    assert (run.status, run.finished_at, run.config["workers"]) == ("running", None, 4)
    assert lake.snapshots()["message"][-1] == "train: resume run r1"
    runs.fail(lake, "r1", stage="train", error=ValueError("the env server\nwent away"))
    run = runs.stored(lake, "r1")
    assert run.status == "failed" and run.finished_at is not None
    assert lake.snapshots()["message"][-1] == "train: run r1 failed: ValueError: the env server went away"
    runs.fail(lake, "r1", stage="train", error="x" * 500)  # cut to one short line
    assert len(lake.snapshots()["message"][-1]) == len("train: run r1 failed: ") + runs.ERROR_CHARS


def test_a_field_added_later_keeps_old_runs_and_ids(lake):
    old = Job(name="a", size=2)
    runs.begin(lake, job_run("old", old), stage="collect")  # stored before `depth` existed
    # at the value the old runs were made at, the new field resumes them; at another it is refused by name
    assert runs.find(lake, "old", JobWithDepth(name="a", size=2), kinds=("collect",)) is not None
    with pytest.raises(TrajlakeError, match=r"^run old already exists with depth 3; given 5 "):
        runs.find(lake, "old", JobWithDepth(name="a", size=2, depth=5), kinds=("collect",))
    # a run stored with the field is held to its stored value
    runs.begin(lake, job_run("new", JobWithDepth(name="a", depth=5)), stage="collect")
    assert JobWithDepth(name="a", depth=5).differences(runs.stored(lake, "new").config) == []
    assert JobWithDepth(name="a").differences(runs.stored(lake, "new").config) == [("depth", 5, 3)]
    # ids hashed from the settings: the old id is kept at the old value, and the operational field is left out
    old_id = runs.hashed_run_id("job-", id_settings(old), 12)
    assert runs.hashed_run_id("job-", id_settings(JobWithDepth(name="a", size=2, workers=9)), 12) == old_id
    assert runs.hashed_run_id("job-", id_settings(JobWithDepth(name="a", size=2, depth=4)), 12) != old_id
    assert run_fields(JobWithDepth) == ("name", "tags", "size", "depth")
    assert run_fields(JobWithDepth, ("size", "depth")) == ("size", "depth", "name", "tags")


def test_new_run_ids_name_their_kind():
    first, second = runs.new_run_id("collect"), runs.new_run_id("collect")
    assert re.fullmatch(r"collect-\d{8}-\d{6}-[0-9a-f]{6}", first) and first != second


def test_only_the_ledger_writes_runs():
    """Every write to `runs` goes through store/runs.py (the stages begin, restart, finish and fail runs there)."""
    root = Path(runs.__file__).resolve().parents[1]
    writes = re.compile(r"""\.update\(\s*["']runs["']|["']runs["']\s*:\s*\[|(INSERT\s+INTO|UPDATE)\s+\S*runs\b""")
    library = [p for d in sorted(root.iterdir()) if (d / "__init__.py").is_file() and d.name != "tests"
               for p in d.rglob("*.py")]
    ledger = root / "store" / "runs.py"
    assert len(library) > 50 and ledger in library
    found = [str(p.relative_to(root)) for p in library if p != ledger and writes.search(p.read_text())]
    assert found == []


# ---- runs.open: a run's life as one context -------------------------------------------------------
def _status(lake, run_id: str) -> str | None:
    run = runs.stored(lake, run_id)
    return run.status if run else None


def test_open_begins_and_finishes_holding_the_lease_throughout(lake):
    from trajlake.store import lease

    config = Job(name="a")
    with runs.open(lake, "collect", config, run_id="o1") as run:
        assert run.resumed is None and lease.holder_of(lake, "o1") is not None
        run.begin(job_run("o1", config))
        assert _status(lake, "o1") == "running"
    assert _status(lake, "o1") == "finished" and lease.holder_of(lake, "o1") is None
    with runs.open(lake, "collect", config, run_id="o1") as run:  # a resume finds it
        assert run.resumed.status == "finished"
        run.restart()
        assert _status(lake, "o1") == "running"
    assert _status(lake, "o1") == "finished"


def test_open_marks_a_begun_run_failed_with_the_error_and_gives_the_lease_back(lake):
    from trajlake.store import lease

    config = Job(name="a")
    with pytest.raises(KeyboardInterrupt), runs.open(lake, "train", config, run_id="o2") as run:
        run.begin(job_run("o2", config, kind="train"))
        raise KeyboardInterrupt
    assert _status(lake, "o2") == "failed" and lease.holder_of(lake, "o2") is None
    assert any("o2 failed: KeyboardInterrupt" in (m or "") for m in lake.snapshots()["message"].to_list())


def test_open_writes_nothing_when_the_body_fails_before_its_first_write(lake):
    before = lake.snapshots().height
    with pytest.raises(TrajlakeError, match="refused"), runs.open(lake, "collect", Job(name="a"), run_id="o3",
                                                                  lease=False):
        raise TrajlakeError("refused")
    assert runs.stored(lake, "o3") is None and lake.snapshots().height == before


def test_open_refuses_another_kind_and_other_settings_before_any_write(lake):
    with runs.open(lake, "collect", Job(name="a"), run_id="o4") as run:
        run.begin(job_run("o4", Job(name="a")))
    before = lake.snapshots().height
    with pytest.raises(TrajlakeError, match=r"run o4 already exists as a collect run, not an import run"):
        with runs.open(lake, "import", Job(name="a"), run_id="o4"):
            pass
    with pytest.raises(TrajlakeError, match=r"run o4 already exists with name 'a'; given 'b'"):
        with runs.open(lake, "collect", Job(name="b"), run_id="o4"):
            pass
    with pytest.raises(ValueError, match=r"unknown run kind 'sft'; valid: collect, eval, import, train"):
        with runs.open(lake, "sft", Job(name="a"), run_id="o5"):
            pass
    assert lake.snapshots().height == before  # refused with nothing written, no lease taken


def test_open_lets_the_body_end_the_run_its_own_way(lake):
    config = Job(name="a")
    with runs.open(lake, "collect", config, run_id="o6") as run:
        run.begin(job_run("o6", config))
        run.fail("every episode an env error")
    assert _status(lake, "o6") == "failed"
    with runs.open(lake, "collect", config, run_id="o6", lease=False) as run:
        run.begin(job_run("o6", config))  # stored already: nothing written
        run.keep_status()  # a resume with nothing to do leaves the row as it was
    assert _status(lake, "o6") == "failed"


def test_fail_abandoned_ends_only_running_runs_whose_process_is_gone(lake):
    from trajlake.store import lease

    config = Job(name="a")
    for run_id in ("gone", "held", "done"):
        runs.begin(lake, job_run(run_id, config), stage="collect")
    runs.finish(lake, "done", stage="collect")
    held = lease.acquire(lake, "held", "collect")  # this live process holds it: not abandoned
    try:
        marked = runs.fail_abandoned(lake, ["gone", "held", "done", "never-stored"], stage="train",
                                     why="stopped with its learner")
    finally:
        held.release()
    assert marked == ["gone"]
    assert [_status(lake, r) for r in ("gone", "held", "done")] == ["failed", "running", "finished"]
    assert any("gone failed: stopped with its learner" in (m or "") for m in lake.snapshots()["message"].to_list())
    assert lease.holder_of(lake, "gone") is None  # the lease it took to end the run is given back


def test_only_runs_open_drives_a_runs_life():
    """No stage begins, restarts, finishes or fails a run, or takes a run's lease, but through runs.open."""
    root = Path(runs.__file__).resolve().parents[1]
    calls = re.compile(r"\bruns\.(begin|restart|finish|fail)\(|\brun_lease\.acquire\(")
    library = [p for d in sorted(root.iterdir()) if (d / "__init__.py").is_file() and d.name != "tests"
               for p in d.rglob("*.py")]
    found = sorted(str(p.relative_to(root)) for p in library if calls.search(p.read_text()))
    assert found == ["store/runs.py"]
