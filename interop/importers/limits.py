"""The caps an imported row must stay under, and the check of a row's values once it is read.

Imported rows are untrusted. One row holding a 50 MB message grew an import past 6 GB (a Python copy of the
text per stage: the row, the parsed message, the rendered chat, the tokenizer's input) until it was killed.
So the readers (records.py) measure a row's bytes before they parse it (a JSONL line's length, a JSON list
element's span, a parquet row's Arrow bytes), and `check_row` walks what was parsed: no text over the field
cap, no nesting past `max_depth`, no number that is not finite (NaN, inf, `1e999`, an integer past a float's
range) and no lone surrogate (a JSON `"\\ud800"`, which no UTF-8 encoder or tokenizer takes).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from trajlake.core.errors import TrajlakeError

MB = 1 << 20
#: The defaults, from OpenManus-RL's AgentGym files (../shared/data/agentgym: babyai, maze, textcraft, 1469
#: rows): the largest row is 49 KB as JSON (maze train; a median row 12-15 KB), the largest single text 15.4 KB
#: (a maze observation), the deepest nesting 3 levels. A field cap of 1 MB and a row cap of 4 MB leave 60x and
#: 80x headroom for longer conversations (a 128k-token context is about 0.5 MB of text), and bound what one row
#: can cost: a few copies of 4 MB, where the unbounded import grew by gigabytes. Raise them for bigger rows
#: (`--max-field-mb`, `--max-row-mb`).
DEFAULT_FIELD_MB = 1
DEFAULT_ROW_MB = 4
#: The deepest nesting of lists and objects a row may hold. A row nested thousands deep made json.loads (and
#: every later walk of the value: the store's JSON columns, polars, Arrow) raise RecursionError.
MAX_DEPTH = 64
#: The largest float; a bigger integer (`10**400` in a JSON file) raised OverflowError where it became one.
FLOAT_MAX = 1.7976931348623157e308

_SURROGATE = re.compile("[\ud800-\udfff]")  # left after decoding only when unpaired: a pair decodes to one char


class TrajectoryImportError(TrajlakeError):
    """An input file, row or tokenizer an importer cannot use; raised before anything is written."""


@dataclass(frozen=True)
class Limits:
    """What one imported row may hold. Sizes are bytes as stored in the file (UTF-8 for JSON, Arrow's for
    parquet)."""

    max_field_bytes: int = DEFAULT_FIELD_MB * MB
    max_row_bytes: int = DEFAULT_ROW_MB * MB
    max_depth: int = MAX_DEPTH

    @classmethod
    def from_mb(cls, field_mb: float | None = None, row_mb: float | None = None) -> Limits:
        """Limits from the command line's megabytes (None: the default); refused unless above 0 and finite."""
        for option, value in (("--max-field-mb", field_mb), ("--max-row-mb", row_mb)):
            if value is not None and not (math.isfinite(value) and 0 < value <= MB):
                raise TrajectoryImportError(f"{option} must be a number of megabytes above 0 (at most {MB}), "
                                            f"got {value}")
        return cls(int((field_mb or DEFAULT_FIELD_MB) * MB), int((row_mb or DEFAULT_ROW_MB) * MB))

    def row_too_big(self, where: str, size: int, *, more: bool = False, rows: int = 1) -> TrajectoryImportError:
        """`where` (a file and its row, or its `rows` rows) is over the row cap; `more`: `size` is only what was
        read before the reader stopped (the row is longer)."""
        cap = f"{'' if rows == 1 else f'{rows} x '}the {_mb(self.max_row_bytes)} row cap"
        what = f"longer than {cap}" if more else f"{_mb(size)}, over {cap}"
        return TrajectoryImportError(f"{where}: {'the row is ' if rows == 1 else ''}{what} (--max-row-mb raises it)")


def check_row(row: Any, where: str, limits: Limits = Limits()) -> None:
    """Refuse `row` (a parsed JSON value, or an Arrow row as Python) when a text in it is over the field cap or
    holds a lone surrogate, a number is not finite, or it nests deeper than `limits.max_depth`. The message
    names `where` (file and row) and the field (`conversations[3].value`). Walked with a stack, not recursion,
    so the check itself cannot overflow Python's."""
    stack: list[tuple[Any, int, tuple | None]] = [(row, 1, None)]
    while stack:
        v, depth, path = stack.pop()
        if isinstance(v, (str, bytes)):
            _check_text(v, where, path, limits)
        elif isinstance(v, float):
            if not math.isfinite(v):
                raise TrajectoryImportError(f"{where}: {_field(path)} is {v}, not a finite number")
        elif isinstance(v, int) and not isinstance(v, bool):
            if abs(v) > FLOAT_MAX:
                raise TrajectoryImportError(f"{where}: {_field(path)} is an integer of {len(str(abs(v)))} digits, "
                                            "too large for a number (at most about 1.8e308)")
        elif isinstance(v, (dict, list, tuple)):
            if depth > limits.max_depth:
                raise TrajectoryImportError(f"{where}: {_field(path, top=True)} nested too deeply (at most "
                                            f"{limits.max_depth} levels of lists and objects)")
            items = v.items() if isinstance(v, dict) else enumerate(v)
            for k, child in items:
                if isinstance(k, str):  # a key is stored as text too (in the JSON columns)
                    _check_text(k, where, path, limits)
                stack.append((child, depth + 1, (path, k)))


def check_depth(value: Any, where: str, limit: int = MAX_DEPTH) -> None:
    """Refuse `value` when its lists and objects nest deeper than `limit`, or it holds a value `check_row`
    refuses (sizes aside)."""
    check_row(value, where, Limits(max_field_bytes=1 << 62, max_row_bytes=1 << 62, max_depth=limit))


def _check_text(v: str | bytes, where: str, path: tuple | None, limits: Limits) -> None:
    cap, size = limits.max_field_bytes, len(v)
    if isinstance(v, str) and not v.isascii() and size <= cap < size * 4:
        # a character is 1 to 4 UTF-8 bytes: the text is encoded only where that decides
        size = len(v.encode("utf-8", "surrogatepass"))
    if size > cap:
        raise TrajectoryImportError(f"{where}: {_field(path)} is {_mb(size)}, over the {_mb(cap)} field cap "
                                    "(--max-field-mb raises it)")
    lone = _SURROGATE.search(v) if isinstance(v, str) and not v.isascii() else None
    if lone:
        raise TrajectoryImportError(f"{where}: {_field(path)} holds a lone surrogate (\\u{ord(lone[0]):04x} at "
                                    f"character {lone.start()}), which is not text: UTF-8 and tokenizers refuse it")


def _field(path: tuple | None, top: bool = False) -> str:
    """`conversations[3].value` from the (parent, key) chain (`top`: only its first part, `conversations`, for a
    path that may be thousands of levels long); "the row" for the row itself."""
    parts = []
    while path is not None:
        path, key = path
        parts.append(f"[{key}]" if isinstance(key, int) else f".{_clip(key)}")
    parts.reverse()
    return f"`{''.join(parts[:1] if top else parts).lstrip('.')}`" if parts else "the row"


def _clip(key: Any) -> str:
    text = str(key)
    text = text if text.isprintable() and len(text) <= 40 else repr(text[:40])
    return text.encode("ascii", "backslashreplace").decode()  # a surrogate in a key must not break the message


def _mb(size: int) -> str:
    return f"{size / MB:.1f} MB" if size >= MB // 10 else f"{size:,} bytes"


__all__ = ["DEFAULT_FIELD_MB", "DEFAULT_ROW_MB", "FLOAT_MAX", "MAX_DEPTH", "MB", "Limits", "TrajectoryImportError",
           "check_depth", "check_row"]
