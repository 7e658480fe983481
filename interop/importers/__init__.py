"""Importers: bring trajectories recorded elsewhere into the store, token-exact and idempotently.

An importer reads every input file, validates and tokenizes every row, and only then writes, in chunks
that each hold whole episodes with all their turns (one `Lake.append`, one snapshot each). So a bad file
leaves the lake untouched, and re-importing the same data inserts nothing (ids are deterministic). An import is
a run of kind `import` whose identity is its `ImportConfig` (the files' contents, the tokenizer, policy, env and
split): a run id already stored as another kind of run, or as an import of other files, is refused.

What importers share is common.py's (the result, input files, progress); the identity of an import run
config.py's; reading record files (parquet, a JSON list, JSONL) one row at a time records.py's; the caps every row
is held to (its size, a field's size, its nesting, finite numbers) limits.py's. Each importer is a module of its
own (agentgym.py) that imports these, never this package's `__init__`.
"""

from __future__ import annotations

from trajlake.interop.importers.agentgym import import_agentgym
from trajlake.interop.importers.common import ImportResult, resolve_files, stored_episode_ids
from trajlake.interop.importers.config import ImportConfig
from trajlake.interop.importers.limits import MAX_DEPTH, Limits, TrajectoryImportError, check_depth, check_row
from trajlake.interop.importers.records import SUFFIXES, iter_records, read_records, require_column

__all__ = [
    "MAX_DEPTH", "SUFFIXES", "ImportConfig", "ImportResult", "Limits", "TrajectoryImportError", "check_depth",
    "check_row", "import_agentgym", "iter_records", "read_records", "require_column", "resolve_files",
    "stored_episode_ids",
]
