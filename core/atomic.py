"""How trajlake writes every file or folder a user asked for: beside the target, then renamed over it.

Writing a file in place (open with O_TRUNC) writes into the inode the name points at, and so into every other
name of that inode: a hard link to the lake's catalog (what `cp -al lake backup` makes) given as `sql -o` was
truncated, and the lake no longer opened. `atomic_output(path)` hands the writer a fresh name beside the
target, and when the writer is done renames it over the target (`os.replace`): the target's name then points
at a new inode, and the old one, with every other link to it, keeps its content. A writer that fails leaves
the target as it was (no half-written file either). The one exception is a target that is neither a regular
file, a folder nor missing (`/dev/null`, a FIFO, a terminal): there is nothing to rename over, and it is
written in place, as before.
"""

from __future__ import annotations

import errno
import functools
import os
import secrets
import shutil
import stat
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

#: the prefix of the temporary names (a crash may leave one: the name says whose it is)
PREFIX = ".trajlake-writing-"


@contextmanager
def atomic_output(path: str | Path, *, folder: bool = False) -> Iterator[Path]:
    """Yield the path to write instead of `path`: a file the writer (over)writes, or with `folder` a path the
    writer creates a folder at. On leaving the block without an error it is renamed over `path`'s target
    (symlinks followed, as writing through them did); on an error it is removed. `path` must not be an
    existing folder unless `folder` (nor, then, a non-empty one: rename(2) replaces only an empty folder)."""
    target = Path(os.path.realpath(path))  # through symlinks: a link to the user's file keeps pointing at it
    try:
        st: os.stat_result | None = os.stat(target)
    except FileNotFoundError:
        st = None
    if st is not None and not (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode)):
        yield target  # /dev/null, a FIFO: nothing to keep, nothing to rename over
        return
    if st is not None and stat.S_ISDIR(st.st_mode) and not folder:
        raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(path))
    try:
        fresh, cleanup = _staging(target, folder)
    except OSError as e:
        raise _naming(e, path) from None
    try:
        yield fresh
        try:
            if st is not None and stat.S_ISREG(st.st_mode) and not folder:
                os.chmod(fresh, stat.S_IMODE(st.st_mode))  # a private (0600) file stays private
            os.replace(fresh, target)
        except OSError as e:
            raise _naming(e, path) from None
    finally:
        cleanup()


def _staging(target: Path, folder: bool) -> tuple[Path, Callable[[], None]]:
    """(the fresh path beside `target`, what removes whatever of it is left). A file: a new name created
    exclusively (O_EXCL: nobody's link is followed), with the usual permissions (0666 less the umask). A folder:
    a path inside a private folder (its writer may make it any way it likes)."""
    if folder:
        staging = Path(tempfile.mkdtemp(prefix=PREFIX, dir=target.parent))
        return staging / target.name, lambda: shutil.rmtree(staging, ignore_errors=True)
    while True:
        fresh = target.parent / f"{PREFIX}{secrets.token_hex(6)}-{target.name[:160]}"
        try:
            os.close(os.open(fresh, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
        except FileExistsError:
            continue
        return fresh, functools.partial(fresh.unlink, missing_ok=True)


def _naming(e: OSError, path: str | Path) -> OSError:
    """`e` naming the user's path, not the temporary one (which is gone when the error is shown)."""
    return type(e)(e.errno, e.strerror, str(path)) if e.errno else e


def write_text_atomically(path: str | Path, text: str, encoding: str | None = "utf-8") -> None:
    """`text` written to `path` through `atomic_output`."""
    with atomic_output(path) as fresh:
        fresh.write_text(text, encoding=encoding)


__all__ = ["PREFIX", "atomic_output", "write_text_atomically"]
