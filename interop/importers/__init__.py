"""Importers: bring trajectories recorded elsewhere into the store, token-exact and idempotently.

An importer reads every input file, validates and tokenizes every row, and only then writes, in chunks
that each hold whole episodes with all their turns (one `Lake.append`, one snapshot each). So a bad file
leaves the lake untouched, and re-importing the same data inserts nothing (ids are deterministic).

This module holds what importers share: the error they raise, the result they return, and reading
record files (parquet, JSON list, JSONL).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from os import PathLike
from pathlib import Path
from typing import Any

from trajlake.core.errors import TrajlakeError

#: File kinds an importer reads, by extension.
SUFFIXES = {".parquet": "parquet", ".json": "json", ".jsonl": "jsonl", ".ndjson": "jsonl"}
#: The deepest nesting of lists and objects a row may hold. Imported rows are untrusted: a row nested
#: thousands deep made json.loads (and every later walk of the value: the store's JSON columns, polars,
#: Arrow) raise RecursionError; real trajectory rows are a handful of levels deep.
MAX_DEPTH = 64


class TrajectoryImportError(TrajlakeError):
    """An input file, row or tokenizer an importer cannot use; raised before anything is written."""


@dataclass(frozen=True)
class ImportResult:
    """What an import did. `inserted`/`skipped` count rows per table over every append."""

    run_id: str
    files: tuple[str, ...]
    episodes: int
    turns: int
    inserted: dict[str, int] = field(default_factory=dict)
    skipped: dict[str, int] = field(default_factory=dict)
    snapshots: tuple[int, ...] = ()
    per_file: dict[str, dict[str, int]] = field(default_factory=dict)

    @property
    def episodes_inserted(self) -> int:
        return self.inserted.get("episodes", 0)

    @property
    def episodes_skipped(self) -> int:
        return self.skipped.get("episodes", 0)

    @property
    def turns_inserted(self) -> int:
        return self.inserted.get("turns", 0)

    def __str__(self) -> str:
        """A few lines for people: what was stored, what was there already, and each file's share."""
        snaps = (f"snapshot {self.snapshots[0]}" if len(self.snapshots) == 1 else
                 f"snapshots {self.snapshots[0]}..{self.snapshots[-1]}" if self.snapshots else "no new snapshot")
        lines = [f"run {self.run_id}: imported {self.episodes_inserted} episodes ({self.turns_inserted} turns) from "
                 f"{len(self.files)} file{'s' * (len(self.files) != 1)}, {snaps}"]
        if self.episodes_skipped:
            lines.append(f"  {self.episodes_skipped} episodes were stored already (skipped)")
        for path, counts in self.per_file.items():
            lines.append(f"  {path}: {counts.get('episodes', 0)} episodes, {counts.get('turns', 0)} turns")
        return "\n".join(lines)


def resolve_files(paths: str | PathLike | Iterable[str | PathLike]) -> list[Path]:
    """Input files, in order: a folder stands for its supported files (recursively, sorted)."""
    if isinstance(paths, (str, PathLike)):
        paths = [paths]
    out: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            found = sorted(f for f in p.rglob("*") if f.is_file() and f.suffix.lower() in SUFFIXES)
            if not found:
                raise TrajectoryImportError(f"{p}: folder holds no {'/'.join(SUFFIXES)} files")
            out += found
        elif not p.exists():
            raise TrajectoryImportError(f"{p}: no such file")
        elif p.suffix.lower() not in SUFFIXES:
            raise TrajectoryImportError(
                f"{p}: unsupported file type {p.suffix or '(none)'!r}; use {', '.join(SUFFIXES)}"
            )
        else:
            out.append(p)
    if not out:
        raise TrajectoryImportError("no input files given")
    if len(set(out)) != len(out):
        raise TrajectoryImportError("an input file is given twice")
    return out


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def read_records(path: Path, required: str | None = None) -> list[dict[str, Any]]:
    """The rows of a parquet, JSON (a list of objects) or JSONL file as dicts.

    `required` names a column every file must have; its absence is reported for the file as a whole.
    """
    kind = SUFFIXES[path.suffix.lower()]
    if kind == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        try:
            table = pq.read_table(path)
        except (pa.ArrowException, OSError) as e:
            raise TrajectoryImportError(f"{path}: not a readable parquet file ({_line(e)})") from None
        if required and required not in table.column_names:
            raise TrajectoryImportError(
                f"{path}: no `{required}` column (columns: {', '.join(table.column_names) or 'none'})"
            )
        try:
            rows = table.to_pylist()
        except (pa.ArrowException, RecursionError, ValueError) as e:  # e.g. a value Arrow cannot hand to Python
            raise TrajectoryImportError(f"{path}: cannot read its rows ({_line(e)})") from None
        for n, row in enumerate(rows):
            check_depth(row, f"{path} row {n}")
        return rows
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise TrajectoryImportError(f"{path}: cannot read as UTF-8 text ({_line(e)})") from None
    if kind == "json":
        try:
            rows = json.loads(text)
        except json.JSONDecodeError as e:
            raise TrajectoryImportError(f"{path}: invalid JSON at line {e.lineno} column {e.colno}: {e.msg}") from None
        except RecursionError:
            row = _too_deep_row(text)
            raise TrajectoryImportError(f"{path}{'' if row is None else f' row {row}'}: nested too deeply to read "
                                        f"(at most {MAX_DEPTH} levels of lists and objects)") from None
        if not isinstance(rows, list):
            raise TrajectoryImportError(f"{path}: a JSON file must hold a list of objects, not a {type(rows).__name__}")
        numbered = list(enumerate(rows))
    else:
        numbered = []
        for n, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                numbered.append((n, json.loads(line)))
            except json.JSONDecodeError as e:
                raise TrajectoryImportError(f"{path}: line {n} is not valid JSON ({e.msg})") from None
            except RecursionError:
                raise TrajectoryImportError(f"{path} line {n}: nested too deeply to read (at most {MAX_DEPTH} "
                                            "levels of lists and objects)") from None
    where = "row" if kind == "json" else "line"
    for n, row in numbered:
        if not isinstance(row, dict):
            raise TrajectoryImportError(f"{path} {where} {n}: expected an object, got {type(row).__name__}")
        check_depth(row, f"{path} {where} {n}")
    rows = [row for _, row in numbered]
    if required and rows and not any(required in r for r in rows):
        raise TrajectoryImportError(f"{path}: no `{required}` field in any row (fields: {', '.join(rows[0])})")
    return rows


def check_depth(value: Any, where: str, limit: int = MAX_DEPTH) -> None:
    """Refuse `value` when its lists and objects nest deeper than `limit` (walked without recursion, so the
    check itself cannot overflow the stack)."""
    stack = [(value, 1)]
    while stack:
        v, depth = stack.pop()
        if isinstance(v, dict):
            children = v.values()
        elif isinstance(v, (list, tuple)):
            children = v
        else:
            continue
        if depth > limit:
            raise TrajectoryImportError(f"{where}: nested too deeply (at most {limit} levels of lists and objects)")
        stack.extend((c, depth + 1) for c in children if isinstance(c, (dict, list, tuple)))


def _too_deep_row(text: str) -> int | None:
    """Which element of a JSON list is too deeply nested to parse (None if that cannot be told): each element is
    decoded on its own, so only the failing one hits the recursion limit (run only after a whole-file parse
    failed, so its cost is never paid on good files)."""
    decoder, i, n = json.JSONDecoder(), text.find("["), 0
    if i < 0:
        return None
    i += 1
    while True:
        while i < len(text) and text[i] in " \t\r\n":
            i += 1
        if i >= len(text) or text[i] == "]":
            return None
        try:
            _, i = decoder.raw_decode(text, i)
        except RecursionError:
            return n
        except json.JSONDecodeError:
            return None
        while i < len(text) and text[i] in " \t\r\n":
            i += 1
        if i < len(text) and text[i] == ",":
            i += 1
        n += 1


def stored_episode_ids(lake: Any, ids: list[str]) -> set[str]:
    """Which of `ids` the lake already holds as episodes."""
    if not ids:
        return set()
    found = lake.query("SELECT episode_id FROM episodes WHERE episode_id IN (SELECT unnest(?::VARCHAR[]))", [ids])
    return set(found["episode_id"].to_list())


def progress_bar(what: str, total: int, enabled: bool):
    """An import stage's progress on stderr, as a context manager (core/progress.py: a live bar on a terminal,
    elsewhere a plain line every 10 seconds and the last; disabled: silent)."""
    from trajlake.core.progress import StepProgress

    return StepProgress("import", what, total, enabled=enabled, interval=10.0)


def kind_name(v: Any) -> str:
    """A value's type for error messages ("null" for None)."""
    return "null" if v is None else type(v).__name__


def _line(e: BaseException) -> str:
    s = str(e).strip()
    return s.splitlines()[0] if s else type(e).__name__


from trajlake.interop.importers.agentgym import import_agentgym  # noqa: E402  (needs the names above)

__all__ = [
    "MAX_DEPTH", "ImportResult", "TrajectoryImportError", "check_depth", "import_agentgym", "progress_bar",
    "read_records", "resolve_files", "stored_episode_ids",
]
