"""Writing to a lake: validated, key-idempotent appends, keyed updates, and the transaction both run in (one
DuckLake snapshot with a commit message naming the stage and run id, transient conflicts retried).

`Lake.append`, `Lake.update` and `Lake._transaction` are the entry points; these functions take its connection
(store/connection.py).
"""

from __future__ import annotations

import contextlib
import json
import random
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import duckdb
import pyarrow as pa

from trajlake.core.errors import TrajlakeError
from trajlake.schemas.tables import TABLES, is_json, table_def
from trajlake.store.attach import ALIAS
from trajlake.store.connection import MAX_RETRIES, RETRYABLE
from trajlake.store.validate import conform

if TYPE_CHECKING:
    from trajlake.store.connection import Connection

#: A one-row table every append of a multi-process catalog updates in its transaction. DuckLake lets two
#: transactions insert into one table without conflict, so two writers' `WHERE NOT EXISTS` key checks could
#: both pass and store a key twice; two transactions that both update this row conflict at commit instead, and
#: the loser retries, now seeing the winner's rows. Appends to one lake are serialised at commit.
WRITE_TOKEN = "write_token"
#: Rows per Arrow chunk an INSERT reads. Given one big chunk (what a writer's table usually is), DuckDB 1.5.5 with
#: two threads took twice as long as with one for the same insert (100k turns: 3.4 s against 1.6 s, and 0.65 s
#: against 0.34 s for 100k episode_rewards rows; bench/store.py's ingest fell to 0.86x of pyarrow's at 1M turns);
#: in chunks of a row group (store/migrate.py's ROW_GROUP_ROWS) each thread takes its own (1.9 s and 0.38 s).
#: Slicing copies nothing.
INSERT_CHUNK_ROWS = 8192


@dataclass(frozen=True)
class CommitResult:
    """What one append did: the snapshot it made (None when every row was already stored)."""

    snapshot_id: int | None
    inserted: dict[str, int] = field(default_factory=dict)
    skipped: dict[str, int] = field(default_factory=dict)


def append(conn: Connection, data: Mapping[str, Any], *, stage: str, run_id: str | None = None,
           message: str | None = None) -> CommitResult:
    """Append rows to one or more tables in one transaction (one snapshot); see `Lake.append`."""
    if not data:
        raise TrajlakeError("append needs at least one table")
    staged = {name: conform(rows, table_def(name)) for name, rows in data.items()}
    inserted: dict[str, int] = {}

    def write(cur: duckdb.DuckDBPyConnection) -> bool:
        inserted.clear()
        if conn.catalog.multi_process:
            cur.execute(f"UPDATE {ALIAS}.{WRITE_TOKEN} SET n = n + 1")
        for name, table in staged.items():
            view = f"_incoming_{name}"
            key = table_def(name).key
            match = " AND ".join(f"t.{k} = i.{k}" for k in key)
            # Look the keys up first, on the key columns alone: when none is stored (the usual case) the
            # rows go straight from Arrow to parquet; an anti-join in the INSERT itself would first copy
            # every incoming row, token lists included, into its hash table.
            cur.register(view, table.select(list(key)))
            stored = cur.execute(
                f"SELECT count(*) FROM {view} i WHERE EXISTS (SELECT 1 FROM {ALIAS}.{name} t WHERE {match})"
            ).fetchone()[0]
            cur.unregister(view)
            cur.register(view, pa.Table.from_batches(table.to_batches(max_chunksize=INSERT_CHUNK_ROWS), table.schema))
            n = cur.execute(
                f"INSERT INTO {ALIAS}.{name} SELECT * FROM {view} i"
                + (f" WHERE NOT EXISTS (SELECT 1 FROM {ALIAS}.{name} t WHERE {match})" if stored else "")
            ).fetchone()[0]
            cur.unregister(view)
            inserted[name] = int(n)
        return any(inserted.values())

    msg = message or f"{stage}: append " + ", ".join(f"{n} ({t.num_rows})" for n, t in staged.items())
    snapshot = transaction(conn, write, stage=stage, message=msg, run_id=run_id)
    skipped = {name: staged[name].num_rows - inserted.get(name, 0) for name in staged}
    return CommitResult(snapshot, dict(inserted), skipped)


def update(conn: Connection, table: str, key: Mapping[str, Any], values: Mapping[str, Any], *, stage: str,
           run_id: str | None = None, message: str | None = None) -> int | None:
    """Set `values` on the row of `table` with `key`, in one snapshot; see `Lake.update`."""
    tdef = table_def(table)
    if set(key) != set(tdef.key):
        raise TrajlakeError(f"update of {table} needs its key {tdef.key}, got {tuple(key)}")
    unknown = [c for c in values if c not in tdef.schema.names or c in tdef.key]
    if unknown:
        raise TrajlakeError(f"cannot update column(s) {', '.join(unknown)} of {table}")
    derived = dict(tdef.list_lengths)
    computed = [c for c in values if c in derived]
    if computed:
        raise TrajlakeError(f"cannot update column(s) {', '.join(computed)} of {table}: the store computes "
                            f"them from {', '.join(derived[c] for c in computed)}")
    values = dict(values)
    for column, source in tdef.list_lengths:  # a new list brings its new length
        if source in values:
            values[column] = len(values[source] or ())
    sets = ", ".join(f"{c} = ?" for c in values)
    where = " AND ".join(f"{k} = ?" for k in key)
    params = [json.dumps(v) if _is_json_column(table, c) and v is not None else v for c, v in values.items()]

    def write(cur: duckdb.DuckDBPyConnection) -> bool:
        n = cur.execute(f"UPDATE {ALIAS}.{table} SET {sets} WHERE {where}", params + list(key.values()))
        return bool(n.fetchone()[0])

    return transaction(conn, write, stage=stage, run_id=run_id, message=message or f"{stage}: update {table}")


def transaction(conn: Connection, write: Callable[[duckdb.DuckDBPyConnection], Any], *, stage: str, message: str,
                run_id: str | None = None) -> int | None:
    """Run `write(cursor)` in one transaction with a commit message; retry transient conflicts.

    `write` returns whether it changed anything; if not, the transaction is rolled back and no
    snapshot is made. Returns the snapshot id committed, or None.
    """
    extra = json.dumps({"stage": stage, "run_id": run_id, "commit": uuid.uuid4().hex})
    for attempt in range(MAX_RETRIES):
        cur = conn.cursor()
        try:
            cur.execute("BEGIN TRANSACTION")
            changed = write(cur)
            if changed is False:
                cur.execute("ROLLBACK")
                return None
            cur.execute(
                f"CALL {ALIAS}.set_commit_message(?, ?, extra_info => ?)", [stage, message, extra]
            )
            with conn.commit_lock:
                cur.execute("COMMIT")
                return cur.execute(f"SELECT id FROM {ALIAS}.last_committed_snapshot()").fetchone()[0]
        except duckdb.Error as e:
            _rollback(cur)
            if attempt + 1 < MAX_RETRIES and any(s in str(e).lower() for s in RETRYABLE):
                time.sleep(min(0.01 * 2**attempt, 0.5) * (0.5 + random.random()))
                continue
            raise TrajlakeError(f"{stage}: write failed, nothing was stored: {conn.explain(e)}") from e
        finally:
            cur.close()
    raise AssertionError("unreachable")


def _is_json_column(table: str, column: str) -> bool:
    return is_json(TABLES[table].schema.field(column))


def _rollback(cur: duckdb.DuckDBPyConnection) -> None:
    """Roll back the cursor's transaction; one the failure already ended has nothing to roll back."""
    with contextlib.suppress(duckdb.Error):
        cur.execute("ROLLBACK")
