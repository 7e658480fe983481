"""The `trajlake` commands that read or keep the lake itself: `sql` (read-only queries, or a shell),
`snapshots`, `tables`, `maintain` (compaction and expiry) and `lease` (the run leases)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from trajlake.cli.common import PATH, check_output, open_lake, path_arg, run_id_arg
from trajlake.core import display
from trajlake.core.errors import TrajlakeError

lease_app = typer.Typer(help="The run leases (one live process per run id): show one, or release one whose holder "
                        "is gone for good.", no_args_is_help=True)


def sql(
    query: Optional[str] = typer.Argument(None, help="SQL over the tables; none opens an interactive shell."),
    file: Optional[Path] = typer.Option(None, "--file", "-F", help="Read the SQL from this file (docs/queries/).",
                                        parser=path_arg, metavar=PATH),
    snapshot: Optional[int] = typer.Option(None, "--snapshot", "-s", help="Read the lake as of this snapshot."),
    fmt: Optional[display.Format] = typer.Option(
        None, "--format", "-f", help="Output format (default: the global --format, a table)."),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="Write to this file instead of stdout.",
                                       parser=path_arg, metavar=PATH),
) -> None:
    """Run read-only SQL on the lake (tables: tasks, runs, policies, episodes, turns, reward_specs, ...): one
    statement at a time; anything that would write (DDL, DML, COPY, ATTACH, SET, CALL...) is refused."""
    if file is not None:
        if query is not None:
            raise TrajlakeError("give the SQL either as an argument or with --file, not both")
        from trajlake.core.text_files import read_text_file

        query = read_text_file(file, "SQL file")  # bounded: /dev/zero or a huge file named by mistake
    with open_lake(read_only=True) as lake:
        if query is None:
            display.shell(lake, snapshot=snapshot)
            return
        if out is not None:
            check_output(lake, out, "sql --out")
        fmt = fmt or display.Format(display.table_format().value)
        display.emit(lake.query(query, snapshot=snapshot, **_read_as(fmt, out)), fmt, out)


def _read_as(fmt: display.Format, out: Path | None, max_rows: int = display.MAX_ROWS) -> dict:
    """How to read a result printed in `fmt` (to `out`): as DuckDB's rows for people's tables (no polars or pyarrow
    imported; only the rows printed, unless a file gets them all), as a polars frame for CSV, JSON and parquet."""
    if fmt in display.ROWS_FORMATS:
        return {"output": "rows", "max_rows": max_rows if out is None else None}
    return {"output": "polars"}


def _shown_format() -> display.Format:
    """The format `display.show` prints in: the global --format."""
    return display.Format(display.table_format().value)


def snapshots() -> None:
    """List the lake's snapshots: id, time, stage, message, run id."""
    with open_lake(read_only=True) as lake:
        display.show(lake.snapshots(changes=False, **_read_as(_shown_format(), None, 10_000)), max_rows=10_000)


#: the lake's tables, as its catalog holds them (a lake made by an older version may lack a newer table)
TABLE_NAMES_SQL = """
SELECT table_name FROM information_schema.tables
WHERE table_catalog = current_database() AND table_schema = current_schema() AND table_type = 'BASE TABLE'
ORDER BY table_name
"""


def tables() -> None:
    """List the tables with their row counts."""
    with open_lake(read_only=True) as lake:
        names = [row[0] for row in lake.query(TABLE_NAMES_SQL, output="rows").rows]
        counts = " UNION ALL ".join(f"SELECT {_literal(t)} AS table_name, count(*) AS rows FROM {_identifier(t)}"
                                    for t in names)
        display.show(lake.query(counts, **_read_as(_shown_format(), None)))


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _identifier(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'



def maintain(
    expire_older_than: Optional[str] = typer.Option(
        None, "--expire-older-than", help="Expire snapshots older than this (e.g. 30d, 12h); none: keep all."
    ),
    grace: str = typer.Option("1h", "--grace", help="Never delete files younger than this (live writers)."),
) -> None:
    """Flush inlined rows, merge small files, expire old snapshots, delete unused files."""
    # `is not None`: an empty --expire-older-than (an unset variable) is a bad duration, not "keep all"
    expire = display.parse_duration(expire_older_than) if expire_older_than is not None else None
    grace_td = display.parse_duration(grace)  # both parsed before the lake is opened
    with open_lake() as lake:
        done = lake.maintain(expire_older_than=expire, grace=grace_td)
    display.console.print(", ".join(f"{k}: {v}" for k, v in done.items()))


@lease_app.command("show")
def lease_show(run_id: str = typer.Argument(..., help="The run id.", callback=run_id_arg)) -> None:
    """Who holds a run's lease (host, pid, since when), or none."""
    from trajlake.store.lease import holder_of

    with open_lake(read_only=True) as lake:
        holder = holder_of(lake, run_id)
    display.console.print(f"lease of run {run_id}: {holder.describe() if holder else 'none'}", markup=False)


@lease_app.command("release")
def lease_release(run_id: str = typer.Argument(..., help="The run id.", callback=run_id_arg)) -> None:
    """Remove a run's lease whoever holds it: for a holder on a host that is gone for good (a holder on this host
    that died is taken over by the next run without this)."""
    from trajlake.store.lease import release_any

    with open_lake() as lake:
        holder = release_any(lake, run_id)
    display.console.print(f"released the lease of run {run_id}: {holder.describe() if holder else 'none'}",
                          markup=False)


def register(app: typer.Typer) -> None:
    app.command(context_settings={"ignore_unknown_options": True})(sql)  # SQL may start with a `-- comment`
    app.command()(snapshots)
    app.command()(tables)
    app.command()(maintain)
    app.add_typer(lease_app, name="lease")
