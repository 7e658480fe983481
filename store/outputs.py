"""Where a command may write: never onto the lake it reads, under any name.

`sql -o FILE` with FILE the lake's own catalog overwrote it, and exited 0. Every file or folder a user names for
trajlake to write (sql and export outputs, the viewer's and the report's folders, a train config's
checkpoint_dir, a model's --out, a recipe's report and checkpoint folders) goes through `check_output_path`,
which refuses it when it is, or lies inside, one of the lake's own:

* by path, resolved (symlinks followed, so a link into the lake is caught at its target): the lake's folder (a
  DuckDB-file lake), its catalog file and the catalog's sidecar files (`-wal`, `-shm`, `.wal`, `.data/`...),
  and its local data path;
* by identity (device and inode, as `os.path.samefile` compares): a path resolving elsewhere can still be a
  lake file under another name: a hard link to the catalog or a data file (`cp -al lake backup` makes them for
  every file), or a folder of the lake reached through a bind mount. The lake's files and folders are listed
  once per check (bounded by the lake) and the target and each of its folders compared with them;
* inside an existing folder given as the target: `save_pretrained`, DeepSpeed and tensorboard write their
  files in place, so a hard link (or a symlink) to a lake file planted as `DIR/config.json` would be written
  through. Every entry under the folder, at most `MAX_FOLDER_ENTRIES` of them, is compared with the lake's.

A symlink loop is refused by name. Files are then written beside their target and renamed over it
(core/atomic.py), so even a link this check cannot see (made after it) keeps its content.
"""

from __future__ import annotations

import os
from pathlib import Path

from trajlake.core.errors import TrajlakeError
from trajlake.store import objectstore
from trajlake.store.uri import CatalogURI

#: a file's identity: (device, inode)
Identity = tuple[int, int]
#: the most entries an existing output folder may hold for its check (an output folder is a checkpoint or model
#: folder, a few thousand files at most; past this the walk would cost more than the write it guards)
MAX_FOLDER_ENTRIES = 100_000


class OutputPathError(TrajlakeError):
    """An output path that would write onto the lake; nothing was written."""


def _resolved(path: str | Path, what: str = "path") -> Path:
    try:
        return Path(path).expanduser().resolve()
    except (RuntimeError, OSError) as e:  # Python raises RuntimeError("Symlink loop from ...") for a loop
        raise OutputPathError(f"{what} {path} cannot be followed to a file: a symlink loop or a link too deep "
                              f"({e.strerror if isinstance(e, OSError) and e.strerror else 'too many levels of links'})"
                              ) from None


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


def _is_sidecar(name: str, catalog: str) -> bool:
    """Whether a name beside the catalog file is the catalog or one of its sidecars (`NAME-wal`, `NAME.data`)."""
    return name == catalog or (name.startswith(catalog) and name[len(catalog)] in "-.")


def lake_identities(catalog: CatalogURI) -> tuple[dict[Identity, str], dict[Identity, str]]:
    """(the lake's files, the lake's folders), each by identity (device, inode) with its path: everything under
    its folders, the catalog and its sidecars (folders walked, links inside them not followed: they are not the
    lake's own files)."""
    folders, files = lake_paths(catalog)
    roots = list(folders)
    for file in files:
        try:
            roots += [file.parent / e for e in os.listdir(file.parent) if _is_sidecar(e, file.name)]
        except OSError:  # no folder (a lake not made yet): nothing of it to overwrite
            pass
    file_ids: dict[Identity, str] = {}
    folder_ids: dict[Identity, str] = {}
    for root in roots:
        try:
            st = os.stat(root)
        except OSError:
            continue
        if not os.path.isdir(root):
            file_ids.setdefault((st.st_dev, st.st_ino), str(root))
            continue
        folder_ids.setdefault((st.st_dev, st.st_ino), str(root))
        for parent, dirs, names in os.walk(root):
            for name in dirs + names:
                try:
                    st = os.lstat(os.path.join(parent, name))
                except OSError:  # removed meanwhile (a maintain in another process)
                    continue
                (folder_ids if name in dirs else file_ids).setdefault((st.st_dev, st.st_ino),
                                                                      os.path.join(parent, name))
    return file_ids, folder_ids


def _refuse_by_identity(catalog: CatalogURI, target: Path, path: str | Path, what: str) -> None:
    """OutputPathError when `target`, or a folder above it, is a lake file or folder under another name."""
    file_ids, folder_ids = lake_identities(catalog)
    for candidate in (target, *target.parents):
        try:
            st = os.stat(candidate)
        except OSError:  # not there (yet), or under a file: nothing of the lake
            continue
        key = (st.st_dev, st.st_ino)
        if candidate == target and key in file_ids:
            raise OutputPathError(f"{what} {path} is the lake's file {file_ids[key]} under another name (a hard "
                                  "link?); write outputs elsewhere")
        if key in folder_ids:
            raise OutputPathError(f"{what} {path} is inside the lake: {candidate} is the lake's folder "
                                  f"{folder_ids[key]} under another name (a bind mount?); write outputs elsewhere")
    if os.path.isdir(target):
        _refuse_lake_entries(target, file_ids, folder_ids, path, what)


def _refuse_lake_entries(folder: Path, file_ids: dict[Identity, str], folder_ids: dict[Identity, str],
                         path: str | Path, what: str) -> None:
    """OutputPathError when an entry under `folder` is another name of a lake file or folder (a hard link, a
    symlink, a bind mount: a writer that writes in place, or follows links, would write through it), or when the
    folder holds more than MAX_FOLDER_ENTRIES entries. The lake itself lying in the folder under its own name is
    no other name (`view --out .` beside `./lake`): it is passed over, not walked."""
    seen = 0
    for parent, dirs, names in os.walk(folder):
        for name in list(dirs) + names:
            seen += 1
            if seen > MAX_FOLDER_ENTRIES:
                raise OutputPathError(f"{what} {path} already holds more than {MAX_FOLDER_ENTRIES} entries: name "
                                      "an empty or new folder")
            entry = os.path.join(parent, name)
            for stat_of in (os.lstat, os.stat):  # the entry itself, and what a symlink points at
                try:
                    st = stat_of(entry)
                except OSError:  # a dangling link or a loop: nothing of the lake behind it
                    continue
                lake_entry = file_ids.get((st.st_dev, st.st_ino)) or folder_ids.get((st.st_dev, st.st_ino))
                if lake_entry is None:
                    continue
                if stat_of is os.lstat and not os.path.islink(entry) and os.path.realpath(entry) == lake_entry:
                    if name in dirs:
                        dirs.remove(name)  # the lake's own folder under its own name: not walked
                    break
                raise OutputPathError(f"{what} {path} holds {entry}, which is the lake's {lake_entry} under another "
                                      "name (a hard link or a symlink): a write there would reach the lake; remove "
                                      "it or write elsewhere")


def check_output_path(catalog: CatalogURI, path: str | Path, what: str) -> Path:
    """The resolved `path` (a file or a folder to write) if writing there cannot touch the lake of `catalog`;
    else OutputPathError naming `what` (the option, e.g. "sql --out") and the lake."""
    target = _resolved(path, what)
    folders, files = lake_paths(catalog)
    for folder in folders:
        if target == folder or folder in target.parents:
            raise OutputPathError(f"{what} {path} is inside the lake ({folder}): write outputs elsewhere")
    for file in files:
        for candidate in (target, *target.parents):
            if candidate.parent == file.parent and _is_sidecar(candidate.name, file.name):
                raise OutputPathError(f"{what} {path} is inside the lake (its catalog {file} and the files "
                                      "beside it): write outputs elsewhere")
    _refuse_by_identity(catalog, target, path, what)
    return target


__all__ = ["MAX_FOLDER_ENTRIES", "OutputPathError", "check_output_path", "lake_identities", "lake_paths"]
