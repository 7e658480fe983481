"""Ids as the user gives them, and ids as they reach the file system.

A run id a user names (`--run-id`, a config's `run_id`) is checked here at the edge: non-empty, bounded, and
made of characters that are safe in a path component, a URL and a shell. Ids that come from data (an imported
episode id, a run id read back from a lake) are not trusted to be either: `path_component` encodes any id into
one file name that cannot climb out of its folder, collide with `.`/`..`, or exceed a file system's limit.
"""

from __future__ import annotations

import hashlib
import re
from urllib.parse import quote

from trajlake.core.errors import TrajlakeError

#: the longest id a user may name (the store keeps longer ids from imports; they are encoded for paths)
MAX_ID_LENGTH = 128
#: a user-given id: `/`-separated parts (a train run's collect runs are `RUN/it-N`), each starting with a letter or
#: digit, then letters, digits, `.`, `_`, `-`
_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)*")
#: the longest file name `path_component` returns (file systems allow 255 bytes; room for a suffix)
_MAX_NAME = 200


class InvalidIdError(TrajlakeError, ValueError):
    """A user-given id is empty, too long, or holds a character that is not safe in a path or URL."""


def check_id(value: str | None, what: str = "run id") -> str | None:
    """`value` if it is a valid user-given id (None passes: "generate one"); else InvalidIdError naming `what`."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise InvalidIdError(f"{what} must be text, got {type(value).__name__}")
    if not value.strip():
        raise InvalidIdError(f"{what} must not be empty (leave it out to have one generated)")
    if len(value) > MAX_ID_LENGTH:
        raise InvalidIdError(f"{what} is {len(value)} characters long; at most {MAX_ID_LENGTH}")
    if not _ID.fullmatch(value) or ".." in value:
        raise InvalidIdError(f"{what} {value!r} may hold only letters, digits, '.', '_', '-' and '/' between "
                             "parts (each starting with a letter or digit, no '..'): it names folders and URLs")
    return value


def path_component(value: str) -> str:
    """One file name for any id: percent-encoded (every byte but letters, digits, `_` and `-`, so no `/`, `\\`,
    `.`, `%`-ambiguity or control character survives), with a hash suffix when it would be too long. Distinct
    ids give distinct names; a valid `check_id` id without dots is its own name."""
    name = quote(value, safe="").replace(".", "%2E").replace("~", "%7E")
    # `quote` writes `%` only as `%XX` with hex digits, so "%empty" and a "%~" suffix are names no other id has
    if not name:
        return "%empty"
    if len(name) > _MAX_NAME:
        digest = hashlib.sha256(value.encode("utf-8", "surrogatepass")).hexdigest()[:16]
        name = f"{name[:_MAX_NAME - 18]}%~{digest}"
    return name


__all__ = ["MAX_ID_LENGTH", "InvalidIdError", "check_id", "path_component"]
