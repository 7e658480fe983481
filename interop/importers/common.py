"""What importers share: the result they return, finding and hashing their input files, which episodes are stored
already, and their progress bars."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from os import PathLike
from pathlib import Path
from typing import Any

from trajlake.interop.importers.limits import TrajectoryImportError
from trajlake.interop.importers.records import SUFFIXES


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
