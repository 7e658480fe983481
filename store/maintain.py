"""Lake maintenance: flush inlined rows, merge small files, expire old snapshots, delete unused files: the
store's housekeeping, apart from its reads (store/query.py) and writes (store/write.py). `Lake.maintain` is the
entry point; these take its connection (store/connection.py)."""

from __future__ import annotations

import contextlib
from datetime import datetime, timedelta, timezone
from datetime import time as datetime_time
from typing import TYPE_CHECKING, Any

import duckdb

from trajlake.core.clock import utc_now
from trajlake.core.errors import TrajlakeError
from trajlake.store.attach import ALIAS
from trajlake.store.query import current_snapshot

if TYPE_CHECKING:
    from trajlake.store.connection import Connection


def maintain(conn: Connection, *, expire_older_than: timedelta | None = None,
             grace: timedelta = timedelta(hours=1)) -> dict:
    """Flush inlined rows to parquet, merge small files, expire old snapshots, delete unused files.

    Only files older than `grace` are deleted, so a file a live writer is still writing (not yet in
    any snapshot) is never touched. Snapshots are expired only when `expire_older_than` is given.
    """
    if grace < timedelta(0):
        raise TrajlakeError("grace must not be negative")
    done: dict[str, Any] = {}
    cur = conn.cursor()
    try:
        cur.execute(f"CALL ducklake_flush_inlined_data('{ALIAS}')")
        cur.execute(f"CALL ducklake_merge_adjacent_files('{ALIAS}')")
        if expire_older_than is not None:
            done["snapshots_expired"] = _expire(cur, expire_older_than)
        done["old_files_deleted"] = _cleanup_old_files(conn, cur, grace)
        cutoff = [int(grace.total_seconds() * 1e6)]
        done["orphans_deleted"] = len(cur.execute(
            f"CALL ducklake_delete_orphaned_files('{ALIAS}', older_than => now() - to_microseconds(?))", cutoff
        ).fetchall())
    except duckdb.Error as e:
        raise TrajlakeError(f"maintain failed: {conn.explain(e)}") from None
    finally:
        cur.close()
    done["snapshot"] = current_snapshot(conn)
    return done

# DuckLake's own `older_than` filters compare a SQLite catalog's timestamps, stored as text, as strings
# with an ISO-8601 cutoff ('T' sorts after ' '), so they match every snapshot or file of the cutoff's
# day however recent: `expire_older_than=1h` expired all of today's snapshots. Hence these two helpers.

def _expire(cur: duckdb.DuckDBPyConnection, older_than: timedelta) -> int:
    """Expire the snapshots older than `older_than` (never the latest), chosen by typed time, by id."""
    ids = [r[0] for r in cur.execute(
        f"SELECT snapshot_id FROM ducklake_snapshots('{ALIAS}') "
        f"WHERE snapshot_time < now() - to_microseconds(?) "
        f"AND snapshot_id < (SELECT max(snapshot_id) FROM ducklake_snapshots('{ALIAS}'))",
        [int(older_than.total_seconds() * 1e6)],
    ).fetchall()]
    if not ids:
        return 0
    return len(cur.execute(f"CALL ducklake_expire_snapshots('{ALIAS}', versions => ?)", [ids]).fetchall())

def _cleanup_old_files(conn: Connection, cur: duckdb.DuckDBPyConnection, grace: timedelta) -> int:
    """Delete files that left the lake (merged away, expired) more than `grace` ago."""
    cutoff = utc_now() - grace
    call = f"CALL ducklake_cleanup_old_files('{ALIAS}', older_than => ?::TIMESTAMPTZ)"
    if not conn.catalog.kind.cleanup_in_transaction:
        return len(cur.execute(call, [cutoff]).fetchall())
    cur.execute("BEGIN TRANSACTION")  # the check and the deletion see the same scheduled files
    try:
        young = cur.execute(
            f"SELECT count(*) FROM __ducklake_metadata_{ALIAS}.ducklake_files_scheduled_for_deletion "
            "WHERE schedule_start::TIMESTAMPTZ >= ?::TIMESTAMPTZ",
            [cutoff],
        ).fetchone()[0]
        if not young:
            n = len(cur.execute(f"CALL ducklake_cleanup_old_files('{ALIAS}', cleanup_all => true)").fetchall())
        else:
            # Some are too recent: cut off at the end of the UTC day two days before the cutoff's, which
            # (a stored date is off the UTC date by a day at most) matches only files older than the cutoff.
            day = datetime.combine(cutoff.date(), datetime_time(), tzinfo=timezone.utc)
            n = len(cur.execute(call, [day - timedelta(days=1, microseconds=1)]).fetchall())
        cur.execute("COMMIT")
    except duckdb.Error:
        with contextlib.suppress(duckdb.Error):  # the transaction may already be gone with the error
            cur.execute("ROLLBACK")
        raise
    return n
