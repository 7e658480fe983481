"""The store: a versioned trajectory lake on DuckLake."""

from trajlake.core.errors import (
    CatalogError,
    LakeLockedError,
    SchemaError,
    SnapshotError,
    TrajlakeError,
)
from trajlake.store import runs  # the run ledger: the one writer of the `runs` table
from trajlake.store.lake import CommitResult, Lake
from trajlake.store.runs import StoredRun
from trajlake.store.uri import CatalogURI, parse_uri

# The store's errors are re-exported: they are what its API raises (defined in trajlake.core.errors, shared by all).
__all__ = [
    "Lake", "CommitResult", "CatalogURI", "parse_uri", "runs", "StoredRun",
    "TrajlakeError", "SchemaError", "LakeLockedError", "SnapshotError", "CatalogError",
]
