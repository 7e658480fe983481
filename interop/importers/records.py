"""Reading record files (parquet, a JSON list, JSONL) one row at a time, each row measured before it is parsed.

Every reader yields `(index, where, row)`: the row's 0-based index among the file's rows (what importers derive
ids from), `where` naming the file and the row for messages (`FILE line N` for JSONL, 1-based as editors count;
`FILE row N` elsewhere), and the row as Python values, checked by `limits.check_row`. A row over the row cap is
refused from its size alone, before it becomes Python objects, so one hostile row costs at most about the cap:

- JSONL: a line is read with `readline(cap + 1)`, so a longer one is never read whole;
- a JSON list: ijson's event stream (its C parser, yajl, where the wheel has it) is built into one element at a
  time (ijson's ObjectBuilder), so the file is never held whole; the bytes read while an element is unfinished
  are counted as ijson reads them, in blocks of at most a 64th of the cap (BLOCK), so a longer element is
  refused once the cap is passed, never held whole (one at most a block over the cap can pass unnoticed);
- parquet: the metadata's uncompressed sizes are checked before a row group is read (a compressed value that
  inflates to gigabytes), then each batch of rows is measured in Arrow before `to_pylist`.
"""

from __future__ import annotations

import codecs
import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

import ijson
import pyarrow as pa

from trajlake.interop.importers.limits import MAX_DEPTH, Limits, TrajectoryImportError, check_row

#: File kinds an importer reads, by extension.
SUFFIXES = {".parquet": "parquet", ".json": "json", ".jsonl": "jsonl", ".ndjson": "jsonl"}
#: Rows per Arrow batch: each is measured, then made Python objects at once (at most this many row caps).
ARROW_BATCH = 32
#: The most bytes ijson reads from a JSON list file at a time (a 64th of the row cap where that is less): how
#: finely an unfinished element is measured.
BLOCK = 64 << 10
#: What a JSON list file's top-level value is when it is not a list, by its first parser event.
_NOT_A_LIST = {"start_map": "an object", "string": "a string", "number": "a number", "boolean": "a boolean",
               "null": "null"}
_NOT_A_LIST_MESSAGE = "a JSON file must hold a list of objects, not "

Rows = Iterator[tuple[int, str, dict[str, Any]]]


def iter_records(path: Path, limits: Limits = Limits()) -> Rows:
    """The rows of a parquet, JSON (a list of objects) or JSONL file, one at a time (see the module docstring)."""
    kind = SUFFIXES[path.suffix.lower()]
    rows = _parquet_rows(path, limits) if kind == "parquet" else \
        _json_rows(path, limits) if kind == "json" else _jsonl_rows(path, limits)
    for index, where, row in rows:
        if not isinstance(row, dict):
            raise TrajectoryImportError(f"{where}: expected an object, got {type(row).__name__}")
        check_row(row, where, limits)
        yield index, where, row


def _jsonl_rows(path: Path, limits: Limits) -> Rows:
    cap, index = limits.max_row_bytes, 0
    with _open(path) as f:
        for n in range(1, 1 << 62):
            line = f.readline(cap + 1)  # at most one byte past the cap: a longer line is never read whole
            if not line:
                return
            where = f"{path} line {n}"
            if len(line) > cap and not (len(line) == cap + 1 and line.endswith(b"\n")):
                raise limits.row_too_big(where, len(line), more=True)
            text = _utf8(line, where)
            if not text.strip():
                continue
            try:
                row = _parse(text, where)
            except json.JSONDecodeError as e:
                raise TrajectoryImportError(f"{path}: line {n} is not valid JSON ({e.msg} at column {e.colno})") \
                    from None
            yield index, where, row
            index += 1


def _json_rows(path: Path, limits: Limits) -> Rows:
    """The elements of a JSON list file, parsed by ijson. Numbers are read as floats (`use_float`): in its default
    mode ijson's C backend hands an integer of more digits than Python reads (4300) on as a NULL and the process
    crashes; with floats yajl refuses it, and any integer beyond 64 bits or number past a float's range, as a
    number it cannot read. NaN and Infinity are not JSON: yajl refuses them as invalid. yajl reads a lone high
    surrogate escape (`"\\ud800"`) as `?`, and passes a lone low one on, which Python refuses (a lone surrogate)."""
    with _open(path) as f:
        source = _Counted(f, limits.max_row_bytes)
        rows = _json_list(source, limits.max_depth)
        for index in range(1 << 62):
            where = f"{path} row {index}"
            try:
                row = next(rows)
            except StopIteration:
                return
            except _OverCap as e:
                raise limits.row_too_big(where, e.size, more=True) from None
            except _NotAList as e:
                raise TrajectoryImportError(f"{path}: {e}") from None
            except _TooDeep:
                raise TrajectoryImportError(f"{where}: nested too deeply (at most {limits.max_depth} levels of "
                                            "lists and objects)") from None
            except ijson.JSONError as e:
                raise TrajectoryImportError(f"{where}: {_json_error(e)}") from None
            except UnicodeDecodeError:  # yajl passes a surrogate (`\udc00`, or its UTF-8 bytes) on; Python refuses it
                raise TrajectoryImportError(f"{where}: a text holds a lone surrogate, which is not text: UTF-8 and "
                                            "tokenizers refuse it") from None
            yield index, where, row


class _OverCap(Exception):
    """The element being read is over the cap: `size` bytes were read since it began."""

    def __init__(self, size: int):
        self.size = size


class _NotAList(Exception):
    """The file's first value is not a list, or not JSON (the message)."""


class _TooDeep(Exception):
    """The element being read nests deeper than the limit."""


class _Counted:
    """A binary file as ijson reads it, counting the bytes read since `start` (set where an element begins and
    ends): ijson reads on only when what it holds is parsed, so bytes read since an element began while it is
    unfinished are all that element's, and past `cap` it is refused before more is read. Drops a leading UTF-8
    byte order mark, as some editors write."""

    def __init__(self, f: BinaryIO, cap: int):
        self.f, self.cap, self.count, self.start = f, cap, 0, 0

    def read(self, size: int = -1) -> bytes:
        if self.count - self.start > self.cap:
            raise _OverCap(self.count - self.start)
        data = self.f.read(size)
        if not self.count and data.startswith(codecs.BOM_UTF8):
            data = data[len(codecs.BOM_UTF8):] or self.f.read(size)
        self.count += len(data)
        return data


def _json_list(source: _Counted, max_depth: int) -> Iterator[Any]:
    """The elements of the JSON list `source` holds, built one at a time from ijson's events."""
    events = ijson.basic_parse(source, buf_size=min(BLOCK, max(source.cap // 64, 1)), use_float=True)
    try:
        event, _ = next(events)
    except ijson.JSONError as e:  # "premature EOF" before any value: nothing but spaces
        error = _json_error(e)
        raise _NotAList(_NOT_A_LIST_MESSAGE + "nothing" if "premature EOF" in error else error) from None
    if event != "start_array":
        raise _NotAList(_NOT_A_LIST_MESSAGE + _NOT_A_LIST.get(event, event))
    depth, builder = 1, None  # 1: inside the list, between its elements
    for event, value in events:
        if builder is None:
            if event == "end_array":  # the list's own end (ijson refuses anything after it)
                continue
            builder, source.start = ijson.ObjectBuilder(), source.count
        builder.event(event, value)
        if event in ("start_map", "start_array"):
            depth += 1
            if depth > max_depth + 1:  # the row itself is depth 2 here, 1 in check_row
                raise _TooDeep
        elif event in ("end_map", "end_array"):
            depth -= 1
        if depth == 1:
            yield builder.value
            builder, source.start = None, source.count


def _json_error(e: Exception) -> str:
    """ijson's message in one line: yajl's reason and the text around the error (its message is three lines,
    the reason, that text and a pointer under it)."""
    message = e.args[0] if e.args else ""
    message = message.decode("utf-8", "replace") if isinstance(message, bytes) else str(message)
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    reason = _clip(lines[0].rstrip(".") if lines else type(e).__name__)
    near = f", near `{_clip(lines[1])}`" if len(lines) == 3 and "(right here)" in lines[2] else ""
    return f"{'cannot read a number' if 'overflow' in reason else 'invalid JSON'} ({reason}{near})"


def _clip(text: str, size: int = 80) -> str:
    text = text if len(text) <= size else text[:size] + "..."
    return "".join(c if c.isprintable() else " " for c in text).encode("ascii", "backslashreplace").decode()


def _parquet_rows(path: Path, limits: Limits) -> Rows:
    yield from arrow_rows(parquet_batches(path, limits), f"{path} row", limits)


def parquet_batches(path: Path, limits: Limits = Limits()) -> Iterator[pa.RecordBatch]:
    """A parquet file's rows as Arrow batches of ARROW_BATCH rows, once its metadata passed `_check_row_groups`;
    a file or page Arrow cannot read is one line naming the file."""
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(path)
    except (pa.ArrowException, OSError) as e:
        raise TrajectoryImportError(f"{path}: not a readable parquet file ({_line(e)})") from None
    _check_row_groups(pf, path, limits)
    batches = pf.iter_batches(batch_size=ARROW_BATCH)
    while True:
        try:
            batch = next(batches)
        except StopIteration:
            return
        except (pa.ArrowException, OSError) as e:  # a corrupt page, a bad encoding
            raise TrajectoryImportError(f"{path}: cannot read its rows ({_line(e)})") from None
        yield batch


def arrow_rows(batches: Iterable[pa.RecordBatch], label: str, limits: Limits = Limits()) -> Rows:
    """The rows of Arrow record batches (`label`: "FILE row", the row number is added), each measured in
    Arrow (its bytes in every column, nested ones included) before the batch becomes Python objects."""
    start = 0
    for batch in batches:
        for i in range(batch.num_rows):
            size = batch.slice(i, 1).nbytes  # the bytes this row's values take in every buffer, offsets included
            if size > limits.max_row_bytes:
                raise limits.row_too_big(f"{label} {start + i}", size)
        try:
            rows = batch.to_pylist()
        except (pa.ArrowException, RecursionError, ValueError) as e:  # e.g. a value Arrow cannot hand to Python
            end = start + batch.num_rows - 1
            raise TrajectoryImportError(f"{label}s {start}..{end}: cannot read them ({_line(e)})") from None
        for i, row in enumerate(rows):
            yield start + i, f"{label} {start + i}", row
        start += batch.num_rows


def _check_row_groups(pf: Any, path: Path, limits: Limits) -> None:
    """Refuse, from the file's metadata alone, a row group that inflates past its rows' share of the row cap:
    a value compressed 1000-fold (a run of one character) would be gigabytes once Arrow decompressed it."""
    meta, start = pf.metadata, 0
    for g in range(meta.num_row_groups):
        group = meta.row_group(g)
        rows = group.num_rows
        size = sum(group.column(c).total_uncompressed_size for c in range(group.num_columns))
        if rows and size > rows * limits.max_row_bytes:
            which = f"row {start}" if rows == 1 else f"rows {start}..{start + rows - 1} (one row group, decompressed)"
            raise limits.row_too_big(f"{path} {which}", size, rows=rows)
        start += rows


def read_records(path: Path, required: str | None = None, limits: Limits = Limits()) -> list[dict[str, Any]]:
    """Every row of a file as a list (for small files and tests; importers iterate `iter_records`). `required`
    names a field some row must have; a file with none is refused as a whole."""
    if required and SUFFIXES[path.suffix.lower()] == "parquet":
        require_column(path, required)
    rows = [row for _, _, row in iter_records(path, limits)]
    if required and rows and not any(required in r for r in rows):
        raise TrajectoryImportError(f"{path}: no `{required}` field in any row (fields: {', '.join(rows[0])})")
    return rows


def parquet_columns(path: Path) -> list[str]:
    """A parquet file's column names, from its schema alone."""
    import pyarrow.parquet as pq

    try:
        return pq.read_schema(path).names
    except (pa.ArrowException, OSError) as e:
        raise TrajectoryImportError(f"{path}: not a readable parquet file ({_line(e)})") from None


def require_column(path: Path, name: str) -> None:
    """Refuse a parquet file without column `name`, from its schema (before any row is read)."""
    names = parquet_columns(path)
    if name not in names:
        raise TrajectoryImportError(f"{path}: no `{name}` column (columns: {', '.join(names) or 'none'})")


def _open(path: Path):
    try:
        return open(path, "rb")
    except OSError as e:
        raise TrajectoryImportError(f"{path}: cannot read it ({e.strerror})") from None


def _utf8(raw: bytes, where: str) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise TrajectoryImportError(f"{where}: not UTF-8 text ({e.reason} at byte {e.start})") from None


def _parse(text: str, where: str) -> Any:
    """One row's JSON text as Python (a syntax error is raised as JSONDecodeError, for the caller to place)."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        raise
    except RecursionError:
        raise TrajectoryImportError(f"{where}: nested too deeply to read (at most {MAX_DEPTH} levels of lists "
                                    "and objects)") from None
    except ValueError as e:  # an integer of over 4300 digits (Python's int_max_str_digits)
        raise TrajectoryImportError(f"{where}: cannot read a number ({_line(e)})") from None


def _line(e: BaseException) -> str:
    s = str(e).strip()
    return s.splitlines()[0] if s else type(e).__name__


__all__ = ["ARROW_BATCH", "SUFFIXES", "arrow_rows", "iter_records", "parquet_batches", "parquet_columns",
           "read_records", "require_column"]
