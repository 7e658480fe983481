"""The store: a versioned trajectory lake on DuckLake.

Its names are loaded when first used (PEP 562): `from trajlake.store.uri import parse_uri` or a light command of
the CLI (`trajlake sql`) then pays for duckdb only, not for the polars and pyarrow that writing needs."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from trajlake.core.errors import (
    CatalogError,
    LakeLockedError,
    SchemaError,
    SnapshotError,
    TrajlakeError,
)

if TYPE_CHECKING:
    from trajlake.store import runs
    from trajlake.store.lake import Lake
    from trajlake.store.runs import StoredRun
    from trajlake.store.uri import CatalogURI, parse_uri
    from trajlake.store.write import CommitResult

#: each lazily loaded name: the module that defines it
_HOMES = {"Lake": "lake", "CommitResult": "write", "CatalogURI": "uri", "parse_uri": "uri", "StoredRun": "runs"}


def __getattr__(name: str):
    if name in _HOMES:
        return getattr(importlib.import_module(f"trajlake.store.{_HOMES[name]}"), name)
    if name == "runs":  # the run ledger: the one writer of the `runs` table
        return importlib.import_module("trajlake.store.runs")
    raise AttributeError(f"module 'trajlake.store' has no attribute {name!r}")


__all__ = [
    "Lake", "CommitResult", "CatalogURI", "parse_uri", "runs", "StoredRun",
    "TrajlakeError", "SchemaError", "LakeLockedError", "SnapshotError", "CatalogError",
]
