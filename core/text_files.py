"""Reading a text file a user names (a train config, a reward spec, a SQL file): bounded, whatever it is.

`Path.read_text()` reads to the end: `sql --file /dev/zero` or `train --config /dev/urandom` grew until the
process died of MemoryError (an "internal error"), and a multi-gigabyte file named by mistake took as much
memory. `read_text_file` reads at most `max_bytes + 1` bytes (so a device, a FIFO or a huge file is refused
after that much, not read whole), decodes them as UTF-8, and refuses in one line naming the file and what is
wrong with it: missing, a folder, over the cap, or not UTF-8 text.
"""

from __future__ import annotations

from pathlib import Path

from trajlake.core.errors import TrajlakeError

#: the largest config, spec or SQL file read (the project's largest is under 10 KiB)
MAX_TEXT_FILE_BYTES = 1 << 20


class TextFileError(TrajlakeError, ValueError):
    """A text file a user named cannot be read as one: missing, not a file, too large, or not UTF-8."""


def read_text_file(path: str | Path, what: str, max_bytes: int = MAX_TEXT_FILE_BYTES,
                   error: type[TrajlakeError] = TextFileError) -> str:
    """The text of `path` (UTF-8), refused with `error` ("cannot read {what} {path}: ...", e.g. what = "train
    config") when it cannot be read, holds more than `max_bytes` bytes, or is not UTF-8."""
    def refuse(why: str) -> TrajlakeError:
        return error(f"cannot read {what} {path}: {why}")

    try:
        with open(path, "rb") as f:
            data = f.read(max_bytes + 1)
    except FileNotFoundError:
        raise refuse("no such file") from None
    except IsADirectoryError:
        raise refuse("it is a folder") from None
    except OSError as e:
        raise refuse(e.strerror or type(e).__name__) from None
    if len(data) > max_bytes:
        raise refuse(f"it is larger than {_size(max_bytes)} (is it the right file?)")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise refuse(f"not UTF-8 text (byte {e.start}; is it the right file?)") from None


def _size(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 1 << 20 and not n % (1 << 20) else f"{n >> 10} KiB" if n >= 1024 else f"{n} bytes"


__all__ = ["MAX_TEXT_FILE_BYTES", "TextFileError", "read_text_file"]
