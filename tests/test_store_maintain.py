"""Maintenance: merging, expiring and file cleanup keep every row and every unexpired snapshot readable,
and never delete a file younger than the grace period."""

from __future__ import annotations

import os
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from trajlake.core.errors import SnapshotError, TrajlakeError
from trajlake.schemas import Episode, Turn
from trajlake.store import Lake

CONTENT = "SELECT episode_id, num_turns, status FROM episodes ORDER BY episode_id"


def data_files(lake: Lake) -> set[Path]:
    return {p for p in Path(lake.catalog.data_path).rglob("*.parquet")}


def small_appends(lake: Lake, n: int = 8, prefix: str = "e") -> dict[int, list]:
    """n appends, alternately inlined (2 rows) and parquet (15 rows); snapshot -> the table's content then."""
    history = {}
    for i in range(n):
        rows = 2 if i % 2 else 15
        eps = [Episode(f"{prefix}{i:02d}-{j:02d}", num_turns=1, status=f"s{i}") for j in range(rows)]
        turns = [Turn(e.episode_id, 0) for e in eps]
        snap = lake.append({"episodes": eps, "turns": turns}, stage="collect").snapshot_id
        history[snap] = lake.query(CONTENT).rows()
    s = lake.update("episodes", {"episode_id": f"{prefix}00-00"}, {"status": "updated"}, stage="curate")
    history[s] = lake.query(CONTENT).rows()
    return history


def assert_history(lake: Lake, history: dict[int, list]) -> None:
    for snap, rows in history.items():
        assert lake.query(CONTENT, snapshot=snap).rows() == rows, f"snapshot {snap}"


@pytest.mark.slow  # 5 s per catalog: maintenance passes over a lake
def test_maintain_keeps_rows_and_time_travel_until_expired(lake):
    history = small_appends(lake)
    latest = lake.query(CONTENT).rows()
    files_before = data_files(lake)

    done = lake.maintain()  # flush inlined rows, merge, delete nothing younger than an hour
    assert lake.query(CONTENT).rows() == latest
    assert_history(lake, history)
    assert files_before <= data_files(lake), "a file younger than the grace period was deleted"
    assert done["old_files_deleted"] == 0 and done["orphans_deleted"] == 0

    done = lake.maintain(grace=timedelta(0))  # the merged-away files may go now
    assert done["old_files_deleted"] > 0
    assert not files_before <= data_files(lake)
    assert lake.query(CONTENT).rows() == latest
    assert_history(lake, history)  # time travel still works from the merged files
    assert lake.count("turns") == len(latest)

    # recent snapshots are not expired by a longer horizon (a SQLite catalog once expired the whole day)
    done = lake.maintain(expire_older_than=timedelta(hours=1))
    assert done["snapshots_expired"] == 0
    assert_history(lake, history)

    current = lake.current_snapshot()
    done = lake.maintain(expire_older_than=timedelta(0), grace=timedelta(0))
    assert done["snapshots_expired"] > 0
    assert lake.snapshots()["snapshot_id"].to_list() == [current]
    for snap in history:
        if snap != current:
            with pytest.raises(SnapshotError):
                lake.query(CONTENT, snapshot=snap)
    assert lake.query(CONTENT).rows() == latest
    assert lake.query(CONTENT, snapshot=current).rows() == latest

    # and the lake goes on working
    r = lake.append({"episodes": [Episode("after")]}, stage="collect")
    assert r.snapshot_id > current
    assert lake.count("episodes") == len(latest) + 1


@pytest.mark.slow  # 5 s per catalog: snapshots aged past a horizon
def test_expire_only_snapshots_older_than_the_horizon(lake):
    first = small_appends(lake, n=3)
    time.sleep(3)  # the margin for a loaded machine (tests run in parallel): maintain may start 2 s late
    second = small_appends(lake, n=2, prefix="f")
    assert None not in second
    lake.maintain()  # flush and merge now, so that the expiring call below starts at once
    times = dict(lake.snapshots().select("snapshot_id", "snapshot_time").rows())
    last_old, first_new = times[max(first)], times[min(second)]
    # the horizon just after the last old snapshot: the time that passes until maintain reads the clock
    # moves it later, towards the new snapshots, which are 3 s away
    horizon = datetime.now(timezone.utc) - (last_old + (first_new - last_old) / 20)
    lake.maintain(expire_older_than=horizon, grace=timedelta(0))
    kept = set(lake.snapshots()["snapshot_id"].to_list())
    assert set(second) <= kept
    assert not set(first) & kept
    assert_history(lake, second)


def test_in_flight_files_survive_until_the_grace_period_passes(lake):
    small_appends(lake, n=4)
    folder = Path(lake.catalog.data_path) / "main" / "episodes"
    folder.mkdir(parents=True, exist_ok=True)
    # a file a live writer is still writing: in the data folder, in no snapshot yet
    in_flight = folder / "ducklake-in-flight.parquet"
    pq.write_table(pa.table({"episode_id": ["half-written"]}), in_flight)
    # a true orphan left by a writer that died two hours ago
    orphan = folder / "ducklake-dead-writer.parquet"
    pq.write_table(pa.table({"episode_id": ["lost"]}), orphan)
    old = time.time() - 2 * 3600
    os.utime(orphan, (old, old))
    rows = lake.query(CONTENT).rows()

    done = lake.maintain()
    assert in_flight.exists(), "maintain deleted a file younger than the grace period"
    assert not orphan.exists(), "an orphan older than the grace period was kept"
    assert done["orphans_deleted"] == 1
    lake.maintain(grace=timedelta(minutes=30))
    assert in_flight.exists()

    lake.maintain(grace=timedelta(0))
    assert not in_flight.exists()
    assert lake.query(CONTENT).rows() == rows


def test_negative_grace_is_refused(lake):
    with pytest.raises(TrajlakeError, match="grace"):
        lake.maintain(grace=timedelta(seconds=-1))
