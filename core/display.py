"""Showing query results to people: rich tables, CSV/JSON/parquet output, the SQL shell, durations.

A table for people (`show`) prints in the format chosen once for the process (`set_table_format`: trajlake's
and the recipes' global `--format`): a rich table by default, which on a terminal fits the terminal and
anywhere else (a log file, a pipe) is as wide as its values, never folded; `plain` (columns aligned with
spaces), `markdown` (a pipe table) or `csv` (every row) instead. Off a terminal `console` wraps no line either:
a long line stays one line, and a rule shows its whole title.

What prints is a polars DataFrame or `Rows` (a query's first rows as Python values, with its column names, type
names and row count): `trajlake sql` prints a table from DuckDB's rows without importing polars or pyarrow,
which would double the time a short query takes. polars is imported where a frame is written as CSV, JSON or
parquet.
"""

from __future__ import annotations

import decimal
import enum
import io
import json
import re
import sys
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Union

from rich.cells import cell_len
from rich.console import Console
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from trajlake.core.atomic import atomic_output, write_text_atomically
from trajlake.core.errors import TrajlakeError

if TYPE_CHECKING:
    import polars as pl


class _Console(Console):
    """rich's Console, except off a terminal (a log file, a pipe), where it wraps nothing: a printed line stays
    one line however long (rich would wrap it at 80 columns there), and a rule keeps its whole title."""

    def print(self, *objects, soft_wrap: bool | None = None, **kwargs) -> None:
        if soft_wrap is None and not self.is_terminal:
            soft_wrap = True
        super().print(*objects, soft_wrap=soft_wrap, **kwargs)

    def rule(self, title="", **kwargs) -> None:
        if self.is_terminal:
            super().rule(title, **kwargs)
            return
        text = Text.from_markup(title).plain if isinstance(title, str) else getattr(title, "plain", str(title))
        if not text:
            super().print("─" * self.width, markup=False, highlight=False)
            return
        left = max(2, (self.width - cell_len(text) - 2) // 2)
        right = max(2, self.width - cell_len(text) - 2 - left)
        super().print(f"{'─' * left} {text} {'─' * right}", markup=False, highlight=False, soft_wrap=True)


console = _Console()
MAX_ROWS = 50
MAX_CELL = 60


class Format(str, enum.Enum):
    """An output format: `sql --format`'s (and `emit`'s)."""

    table = "table"
    plain = "plain"
    markdown = "markdown"
    csv = "csv"
    json = "json"
    parquet = "parquet"


class TableFormat(str, enum.Enum):
    """How the tables commands and recipes print for people show: the global `--format`."""

    table = "table"
    plain = "plain"
    markdown = "markdown"
    csv = "csv"


_table_format = TableFormat.table


def set_table_format(fmt: TableFormat | str) -> None:
    """The format every later `show` prints in (a bad name: an error naming the valid ones)."""
    global _table_format
    try:
        _table_format = TableFormat(fmt)
    except ValueError:
        raise TrajlakeError(f"unknown format {fmt!r}; valid: {', '.join(f.value for f in TableFormat)}") from None


def table_format() -> TableFormat:
    """The format `show` prints in (set_table_format's; table unless set)."""
    return _table_format


def _text(v) -> str:
    s = "NULL" if v is None else str(v)
    return s if len(s) <= MAX_CELL else s[: MAX_CELL - 1] + "…"


def _cell(v) -> Text:
    # plain Text, not markup: a value like "[A C]" or "click[buy now]" must show as it is stored
    return Text(_text(v))


@dataclass(frozen=True)
class Rows:
    """A result's first rows as Python values, with its column names, their type names (as polars names them)
    and the result's whole row count: what a table for people needs, without a dataframe library."""

    names: tuple[str, ...]
    types: tuple[str, ...]
    rows: list[tuple]
    height: int


#: what `show`, `emit` and the renderers take
Shown = Union["pl.DataFrame", Rows]


def _type_name(dtype) -> str:
    return str(dtype).split("(")[0].lower()


def _first_rows(df: Shown, max_rows: int) -> Rows:
    """`df`'s first `max_rows` rows as `Rows` (a polars frame's converted)."""
    if isinstance(df, Rows):
        return df if len(df.rows) <= max_rows else Rows(df.names, df.types, df.rows[:max_rows], df.height)
    return Rows(tuple(df.columns), tuple(_type_name(t) for t in df.dtypes), df.head(max_rows).rows(), df.height)


def _caption(df: Shown, max_rows: int) -> str:
    if df.height > max_rows:
        return f"{df.height} rows, first {max_rows} shown (use --format csv or --out for all)"
    return f"{df.height} row{'s' if df.height != 1 else ''}"


def render_table(df: Shown, max_rows: int = MAX_ROWS) -> Table:
    """`df`'s first `max_rows` rows as a rich table (a column too wide for a terminal folds there; off a
    terminal `print_table` gives it its full width)."""
    first = _first_rows(df, max_rows)
    table = Table(show_header=True, header_style="bold")
    for name, type_name in zip(first.names, first.types, strict=True):
        table.add_column(f"{name}\n[dim]{type_name}[/dim]", overflow="fold")
    for row in first.rows:
        table.add_row(*(_cell(v) for v in row))
    table.caption = _caption(df, max_rows)
    return table


def _natural_width(renderable) -> int:
    """How wide `renderable` is when nothing limits it."""
    measure = Console(file=io.StringIO(), width=1_000_000)
    return Measurement.get(measure, measure.options, renderable).maximum


def print_table(table: Table, target: Console | None = None) -> None:
    """`table` on `target` (default: `console`): on a terminal, fitted to it; anywhere else at its full width,
    no value folded or cut, whatever width the output claims (80 columns for a file), with a caption wider
    than the table on a line of its own."""
    target = target or console
    if target.is_terminal:
        target.print(table)
        return
    caption, width = table.caption, _natural_width(table)
    if isinstance(caption, str) and cell_len(caption) > width:
        table.caption = None
        width = _natural_width(table)
    out = Console(file=target.file, width=width, color_system=target.color_system, force_terminal=False,
                  highlight=False)
    out.print(table)
    if table.caption is None and caption:
        target.print(caption, markup=False, highlight=False, soft_wrap=True)
    table.caption = caption


def _flat(v) -> str:
    """A cell of a plain or markdown table: one line (line breaks and tabs shown as \\n, \\r, \\t), cut at
    MAX_CELL."""
    return _text(v).replace("\n", "\\n").replace("\r", "\\r").replace("\t", "\\t")


def plain_text(df: Shown, max_rows: int = MAX_ROWS, *, caption: bool = True) -> str:
    """`df`'s first `max_rows` rows as columns aligned with spaces under a header line, then the row count."""
    first = _first_rows(df, max_rows)
    rows = [list(first.names)] + [[_flat(v) for v in row] for row in first.rows]
    widths = [max(cell_len(r[i]) for r in rows) for i in range(len(first.names))]
    lines = ["  ".join(c + " " * (w - cell_len(c)) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    return "\n".join(lines + ([_caption(df, max_rows)] if caption else [])) + "\n"


def markdown_text(df: Shown, max_rows: int = MAX_ROWS, *, caption: bool = True) -> str:
    """`df`'s first `max_rows` rows as a markdown (GFM) pipe table, then the row count after a blank line."""
    def esc(c: str) -> str:
        return c.replace("|", "\\|")

    first = _first_rows(df, max_rows)
    rows = [[esc(c) for c in first.names]] + [[esc(_flat(v)) for v in row] for row in first.rows]
    widths = [max(3, *(cell_len(r[i]) for r in rows)) for i in range(len(first.names))]

    def line(r: list[str]) -> str:
        return "| " + " | ".join(c + " " * (w - cell_len(c)) for c, w in zip(r, widths, strict=True)) + " |"

    lines = [line(rows[0]), "| " + " | ".join("-" * w for w in widths) + " |", *(line(r) for r in rows[1:])]
    return "\n".join(lines + (["", _caption(df, max_rows)] if caption else [])) + "\n"


def show(df: Shown, max_rows: int = MAX_ROWS) -> None:
    """`df` printed for people, on stdout, in the format chosen for the process (`set_table_format`)."""
    emit(df, Format(_table_format.value), None, max_rows=max_rows)


def _write(out: Path, text: str | None = None, table: Table | None = None) -> None:
    """Write `text` (or `table`) to the file `out`, beside it first and renamed over it (core/atomic.py)."""
    if table is not None:
        with io.StringIO() as buffer:
            print_table(table, Console(file=buffer))
            text = buffer.getvalue()
    try:
        write_text_atomically(out, text, encoding=None)
    except OSError as e:  # the file named, and why, in one line (not errno's "[Errno 2] ...")
        raise TrajlakeError(f"cannot write {out}: {e.strerror or e}") from None


#: the formats `emit` writes from `Rows` (people's tables); the others need the whole result as a frame
ROWS_FORMATS = (Format.table, Format.plain, Format.markdown)


def emit(df: Shown, fmt: Format, out: Path | None, max_rows: int = MAX_ROWS) -> None:
    """Write `df` in `fmt` to `out` (a file: every row) or stdout (table, plain, markdown: the first
    `max_rows` rows). `Rows` print in ROWS_FORMATS only, and to a file only when they hold every row."""
    fmt = Format(fmt)
    if isinstance(df, Rows) and (fmt not in ROWS_FORMATS or (out is not None and len(df.rows) < df.height)):
        raise TrajlakeError(f"internal: {fmt.value} output of {df.height} rows needs them as a frame")
    if fmt is Format.parquet:
        if out is None:
            raise TrajlakeError("--format parquet needs --out PATH")
        try:
            out.parent.mkdir(parents=True, exist_ok=True)
            with atomic_output(out) as fresh:
                df.write_parquet(fresh)
        except OSError as e:  # the file named, and why, in one line
            raise TrajlakeError(f"cannot write {out}: {e.strerror or e}") from None
        console.print(f"wrote {df.height} rows to {out}")
        return
    if fmt is Format.table:
        if out is not None:
            _write(out, table=render_table(df, max_rows=df.height))
        else:
            print_table(render_table(df, max_rows))
        return
    if fmt in (Format.plain, Format.markdown):
        render = plain_text if fmt is Format.plain else markdown_text
        if out is not None:
            _write(out, render(df, df.height))
        else:
            _stdout(render(df, max_rows))
        return
    # LIST, STRUCT and MAP columns are JSON in both formats: a JSON text cell in CSV, nested JSON in JSON (a MAP,
    # which reaches polars as a list of key/value structs, as an object)
    import polars as pl

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
        _write(out, text)
    else:
        _stdout(text if text.endswith("\n") else text + "\n")


def _stdout(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()


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
    import polars as pl

    if df.height == 0:
        show(df)
        return
    if key:
        names = [str(v) for v in df[key].to_list()]
    else:
        names = ["value"] if df.height == 1 else [f"value{i}" for i in range(df.height)]
    body = df.drop(key) if key else df
    show(body.cast(pl.String).transpose(include_header=True, header_name="metric", column_names=names))


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
                show(lake.query("SELECT table_name FROM duckdb_tables() WHERE database_name = 'lake'"))
            else:
                console.print(".tables | .snapshot [N] | .quit")
            continue
        buffer.append(line)
        if stripped.endswith(";"):
            statement = "\n".join(buffer)
            buffer.clear()
            try:
                show(lake.query(statement, snapshot=snapshot))
            except TrajlakeError as e:
                console.print(f"[red]error:[/red] {e}")
    if buffer and "".join(buffer).strip():
        show(lake.query("\n".join(buffer), snapshot=snapshot))


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
