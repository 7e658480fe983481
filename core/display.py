"""Showing query results to people: rich tables, CSV/JSON/parquet output, the SQL shell, durations."""

from __future__ import annotations

import decimal
import enum
import json
import re
import sys
from datetime import timedelta
from pathlib import Path

import polars as pl
from rich.console import Console
from rich.table import Table
from rich.text import Text

from trajlake.core.errors import TrajlakeError

console = Console()
MAX_ROWS = 50
MAX_CELL = 60


class Format(str, enum.Enum):
    table = "table"
    csv = "csv"
    json = "json"
    parquet = "parquet"


def _cell(v) -> Text:
    s = "NULL" if v is None else str(v)
    # plain Text, not markup: a value like "[A C]" or "click[buy now]" must show as it is stored
    return Text(s if len(s) <= MAX_CELL else s[: MAX_CELL - 1] + "…")


def _type_name(dtype: pl.DataType) -> str:
    return str(dtype).split("(")[0].lower()


def render_table(df: pl.DataFrame, max_rows: int = MAX_ROWS) -> Table:
    table = Table(show_header=True, header_style="bold")
    for name, dtype in df.schema.items():
        table.add_column(f"{name}\n[dim]{_type_name(dtype)}[/dim]", overflow="fold")
    for row in df.head(max_rows).iter_rows():
        table.add_row(*(_cell(v) for v in row))
    if df.height > max_rows:
        table.caption = f"{df.height} rows, first {max_rows} shown (use --format csv or --out for all)"
    else:
        table.caption = f"{df.height} row{'s' if df.height != 1 else ''}"
    return table


def emit(df: pl.DataFrame, fmt: Format, out: Path | None, max_rows: int = MAX_ROWS) -> None:
    """Write `df` in `fmt` to `out` (a file) or stdout."""
    fmt = Format(fmt)
    if fmt is Format.parquet:
        if out is None:
            raise TrajlakeError("--format parquet needs --out PATH")
        try:
            out.parent.mkdir(parents=True, exist_ok=True)
            df.write_parquet(out)
        except OSError as e:  # the file named, and why, in one line
            raise TrajlakeError(f"cannot write {out}: {e.strerror or e}") from None
        console.print(f"wrote {df.height} rows to {out}")
        return
    if fmt is Format.table:
        if out is not None:
            try:
                with open(out, "w") as f:
                    Console(file=f, width=200).print(render_table(df, max_rows=df.height))
            except OSError as e:  # the file named, and why, in one line (not errno's "[Errno 2] ...")
                raise TrajlakeError(f"cannot write {out}: {e.strerror}") from None
        else:
            console.print(render_table(df, max_rows))
        return
    # LIST, STRUCT and MAP columns are JSON in both formats: a JSON text cell in CSV, nested JSON in JSON (a MAP,
    # which reaches polars as a list of key/value structs, as an object)
    nested = [c for c, t in df.schema.items() if t.is_nested()]
    if fmt is Format.csv:
        df = df.with_columns(pl.Series(c, [_json_text(_plain(v)) for v in df[c].to_list()], dtype=pl.String)
                             for c in nested)
        text = df.write_csv()
    elif nested:
        rows = [{k: _plain(v) for k, v in row.items()} for row in df.iter_rows(named=True)]
        text = json.dumps(rows, default=_json_default, ensure_ascii=False)
    else:
        text = df.write_json()
    if out is not None:
        try:
            Path(out).write_text(text)
        except OSError as e:
            raise TrajlakeError(f"cannot write {out}: {e.strerror}") from None
    else:
        sys.stdout.write(text if text.endswith("\n") else text + "\n")


def _plain(v):
    """A nested cell as plain JSON values: a MAP's list of {key, value} structs as an object."""
    if isinstance(v, list):
        if v and all(isinstance(x, dict) and set(x) == {"key", "value"} for x in v):
            return {str(x["key"]): _plain(x["value"]) for x in v}
        return [_plain(x) for x in v]
    if isinstance(v, dict):
        return {k: _plain(x) for k, x in v.items()}
    return v


def _json_default(v):
    return float(v) if isinstance(v, decimal.Decimal) else str(v)  # decimals as numbers; dates and the like as text


def _json_text(v) -> str | None:
    return None if v is None else json.dumps(v, default=_json_default, ensure_ascii=False)


def emit_vertical(df: pl.DataFrame, key: str | None = None) -> None:
    """Print a few wide rows as one row per column (metric | value...), which fits a terminal."""
    if df.height == 0:
        emit(df, Format.table, None)
        return
    if key:
        names = [str(v) for v in df[key].to_list()]
    else:
        names = ["value"] if df.height == 1 else [f"value{i}" for i in range(df.height)]
    body = df.drop(key) if key else df
    emit(body.cast(pl.String).transpose(include_header=True, header_name="metric", column_names=names),
         Format.table, None)


def shell(lake, snapshot: int | None = None) -> None:
    """A small SQL shell: statements end with `;`, `.snapshot N` pins a snapshot, `.quit` leaves."""
    interactive = sys.stdin.isatty()
    if interactive:
        try:
            import readline  # noqa: F401 (line editing and history for input())
        except ImportError:
            pass
        console.print(f"trajlake SQL on {lake.catalog.raw}; end statements with ';', .help for commands")
    buffer: list[str] = []
    while True:
        try:
            line = input("trajlake> " if not buffer else "      ...> ") if interactive else sys.stdin.readline()
        except EOFError:
            break
        if not interactive and line == "":
            break
        stripped = line.strip()
        if not buffer and stripped.startswith("."):
            cmd, *arg = stripped.split()
            if cmd in (".quit", ".exit"):
                break
            if cmd == ".snapshot":
                snapshot = int(arg[0]) if arg else None
                console.print(f"reading snapshot {snapshot if snapshot is not None else 'latest'}")
            elif cmd == ".tables":
                emit(lake.query("SELECT table_name FROM duckdb_tables() WHERE database_name = 'lake'"),
                     Format.table, None)
            else:
                console.print(".tables | .snapshot [N] | .quit")
            continue
        buffer.append(line)
        if stripped.endswith(";"):
            statement = "\n".join(buffer)
            buffer.clear()
            try:
                emit(lake.query(statement, snapshot=snapshot), Format.table, None)
            except TrajlakeError as e:
                console.print(f"[red]error:[/red] {e}")
    if buffer and "".join(buffer).strip():
        emit(lake.query("\n".join(buffer), snapshot=snapshot), Format.table, None)


_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}
_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
#: the longest duration accepted: timedelta overflows past 999,999,999 days and the lake's `now() - age`
#: past its timestamps' range, and nothing a lake holds is older than a century
MAX_DURATION = timedelta(days=36_500)


def parse_duration(text: str) -> timedelta:
    """'90s', '30m', '12h', '7d', '2w' -> timedelta, at most MAX_DURATION (100 years)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*", text or "")
    if not m:
        raise TrajlakeError(f"bad duration {text!r}: use a number and a unit s, m, h, d or w (e.g. 7d)")
    seconds = float(m.group(1)) * _SECONDS[m.group(2)]  # compared as a float first: timedelta() would overflow
    if seconds > MAX_DURATION.total_seconds():
        raise TrajlakeError(f"duration {text.strip()!r} is too long: at most {MAX_DURATION.days}d (100 years)")
    return timedelta(**{_UNITS[m.group(2)]: float(m.group(1))})
