"""Reading record files (parquet, a JSON list, JSONL) one row at a time, each row measured before it is parsed.

Every reader yields `(index, where, row)`: the row's 0-based index among the file's rows (what importers derive
ids from), `where` naming the file and the row for messages (`FILE line N` for JSONL, 1-based as editors count;
`FILE row N` elsewhere), and the row as Python values, checked by `limits.check_row`. A row over the row cap is
refused from its size alone, before it becomes Python objects, so one hostile row costs at most about the cap:

- JSONL: a line is read with `readline(cap + 1)`, so a longer one is never read whole;
- a JSON list: elements are found by a scan of the bytes (strings, brackets and commas; json_stream.py) and
  parsed one at a time, so the file is never held whole;
- parquet: the metadata's uncompressed sizes are checked before a row group is read (a compressed value that
  inflates to gigabytes), then each batch of rows is measured in Arrow before `to_pylist`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa

from trajlake.interop.importers.json_stream import JSONListError, json_list_elements
from trajlake.interop.importers.limits import MAX_DEPTH, Limits, TrajectoryImportError, check_row

#: File kinds an importer reads, by extension.
SUFFIXES = {".parquet": "parquet", ".json": "json", ".jsonl": "jsonl", ".ndjson": "jsonl"}
#: Rows per Arrow batch: each is measured, then made Python objects at once (at most this many row caps).
ARROW_BATCH = 32

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
    with _open(path) as f:
        elements = json_list_elements(f, limits.max_row_bytes)
        for index in range(1 << 62):
            try:
                raw = next(elements)
            except StopIteration:
                return
            except JSONListError as e:
                if e.size is not None:
                    raise limits.row_too_big(f"{path} row {e.row}", e.size, more=True) from None
                raise TrajectoryImportError(f"{path}: {e}") from None
            where = f"{path} row {index}"
            try:
                row = _parse(_utf8(raw, where), where)
            except json.JSONDecodeError as e:  # where in the file: the element's start, plus where in it
                line, col = raw.line + e.lineno - 1, (raw.column + e.colno - 1 if e.lineno == 1 else e.colno)
                raise TrajectoryImportError(f"{path}: invalid JSON at line {line} column {col} (row {index}): "
                                            f"{e.msg}") from None
            yield index, where, row


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
