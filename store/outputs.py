"""Where a command may write its output: never onto the lake it reads.

`sql -o FILE` with FILE the lake's own catalog overwrote it, and exited 0. Every command that writes a file or
folder a user names (sql and export outputs, the viewer's and the report's folders) resolves it first (symlinks
included, so a link into the lake is caught at its target) and refuses any path that is, or lies inside, one of
the lake's own: its folder (a DuckDB-file lake), its catalog file and the catalog's sidecar files (`-wal`,
`-shm`, `.wal`, `.data/`...), and its local data path.
"""

from __future__ import annotations

from pathlib import Path

from trajlake.core.errors import TrajlakeError
from trajlake.store import objectstore
from trajlake.store.uri import CatalogURI


class OutputPathError(TrajlakeError):
    """An output path that would write onto the lake; nothing was written."""


def _resolved(path: str | Path) -> Path:
    return Path(path).expanduser().resolve()


def lake_paths(catalog: CatalogURI) -> tuple[list[Path], list[Path]]:
    """(folders whose every path is the lake's, catalog files whose name prefixes the lake's sidecar files)."""
    folders: list[Path] = []
    files: list[Path] = []
    if catalog.data_path and not objectstore.is_remote(catalog.data_path):
        folders.append(_resolved(catalog.data_path))
    path = catalog.catalog_path
    if path is not None:
        files.append(_resolved(path))
        if catalog.kind.folder_lake:
            folders.append(_resolved(path).parent)
    return folders, files


def check_output_path(catalog: CatalogURI, path: str | Path, what: str) -> Path:
    """The resolved `path` if writing there cannot touch the lake of `catalog`; else OutputPathError naming
    `what` (e.g. "sql --out")."""
    target = _resolved(path)
    folders, files = lake_paths(catalog)
    for folder in folders:
        if target == folder or folder in target.parents:
            raise OutputPathError(f"{what} {path} is inside the lake ({folder}): write outputs elsewhere")
    for file in files:
        for candidate in (target, *target.parents):
            name = candidate.name
            if candidate.parent == file.parent and (name == file.name or name[len(file.name):][:1] in ("-", ".")
                                                    and name.startswith(file.name)):
                raise OutputPathError(f"{what} {path} is inside the lake (its catalog {file} and the files "
                                      "beside it): write outputs elsewhere")
    return target


__all__ = ["OutputPathError", "check_output_path", "lake_paths"]
