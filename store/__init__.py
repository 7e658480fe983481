"""The store: a versioned trajectory lake on DuckLake."""

from trajlake.store.errors import (
    CatalogError,
    LakeLockedError,
    SchemaError,
    SnapshotError,
    TrajlakeError,
)
from trajlake.store.lake import CommitResult, Lake
from trajlake.store.uri import CatalogURI, parse_uri

__all__ = [
    "Lake", "CommitResult", "CatalogURI", "parse_uri",
    "TrajlakeError", "SchemaError", "LakeLockedError", "SnapshotError", "CatalogError",
]
