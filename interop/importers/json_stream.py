"""The elements of a JSON list file, one at a time, as bytes: the file is read in blocks, and only the element
being read is held (at most `cap` bytes: a longer one is refused while it is read, never held whole).

The scan looks at strings, brackets and commas only: a comma or the closing bracket at the list's own level ends
an element; a bracket or comma inside a string is text. Bytes suffice because UTF-8 never uses an ASCII byte
inside a multi-byte character. Each element's own syntax is checked when it is parsed (records.py), so a file is
accepted exactly when it is a valid JSON list.

Why not ijson: tried in its place (ijson 3.6.0, C backend yajl2_c), it turned a lone surrogate escape
(`"\ud800"`) into `?` without a word (data changed on import), crashed on an integer of over 4300 digits
(SystemError from basic_parse, a segfault from items) unless numbers are read as floats, which then refuses
integers from 2**63 up, and its prefix-tracking readers take memory quadratic in the nesting depth. An element
here is parsed by Python's own json module, which refuses each of these by name.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import BinaryIO

BLOCK = 1 << 20
#: a string (to its closing quote, or to the end of what is read so far), a bracket or a comma
_TOKEN = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"?|[][{},]', re.S)  # re.S: `\.` is any escaped byte
_SPACE = b" \t\r\n"


class JSONListError(ValueError):
    """The file is not a JSON list, or element `row` is over the cap (`size`: its bytes read so far)."""

    def __init__(self, message: str, row: int | None = None, size: int | None = None):
        super().__init__(message)
        self.row, self.size = row, size


class Element(bytes):
    """An element's bytes, with the line and column (1-based; the column in bytes) where it starts in the file."""

    line: int
    column: int


def json_list_elements(f: BinaryIO, cap: int) -> Iterator[Element]:
    """The elements of the JSON list in binary file `f`, each as its bytes (surrounding spaces included)."""
    scan = _Scan(f)
    scan.open_list()
    depth, pos, row = 0, scan.base, 0  # the element being read starts at scan.buf[scan.base]
    while True:
        m = _TOKEN.search(scan.buf, pos)
        if m is None or (m[0][:1] == b'"' and not _closed(m[0])):
            # nothing more in what is read, or a string that goes on past it: read on
            if len(scan.buf) - scan.base > cap:
                raise JSONListError("element over the cap", row, len(scan.buf) - scan.base)
            pos = len(scan.buf) if m is None else m.start()
            more, shift = scan.more()
            if not more:
                raise scan.syntax_error(scan.base, "the file ends before its list is closed")
            pos -= shift
            continue
        token, pos = m[0], m.end()
        if token[:1] == b'"':
            continue
        if token in (b"[", b"{"):
            depth += 1
        elif depth:  # inside the element: a closing bracket leaves a level, a comma changes nothing
            if token != b",":
                depth -= 1
        elif token == b"}":
            raise scan.syntax_error(m.start(), "a `}` closes nothing", parse=False)
        else:  # the list's own `,` or `]`: the element ends here
            if m.start() - scan.base > cap:
                raise JSONListError("element over the cap", row, m.start() - scan.base)
            raw = scan.element(m.start())
            if raw.strip(_SPACE) or token == b"," or row:  # `[]` holds no element; `[1,]` an empty one (refused)
                yield raw
                row += 1
            scan.drop_to(pos)
            if token == b"]":
                scan.expect_end()
                return


def _closed(string: bytes) -> bool:
    """Whether a string token ends with its closing quote: not a lone `"`, and the last quote not escaped (an even
    run of backslashes before it)."""
    if len(string) < 2 or not string.endswith(b'"'):
        return False
    body = string[1:-1]
    return (len(body) - len(body.rstrip(b"\\"))) % 2 == 0


class _Scan:
    """The bytes read (`buf`, from file offset `offset`), of which those before `base` are used, and where lines
    start, for messages. Used bytes are dropped only when a block is read, not at every element (a copy each)."""

    def __init__(self, f: BinaryIO):
        self.f, self.buf, self.offset, self.base = f, b"", 0, 0
        self.lines, self.line_start = 1, 0  # the line of buf[base] and the file offset where that line starts
        while len(self.buf) < 3 and self.more()[0]:
            pass
        if self.buf.startswith(b"\xef\xbb\xbf"):  # a UTF-8 byte order mark, as some editors write
            self.drop_to(3)
            self.line_start = 3

    def more(self) -> tuple[bool, int]:
        """Read another block onto `buf`, first dropping the used bytes; (False at the end of the file, how far
        positions in `buf` moved)."""
        shift, block = self.base, self.f.read(BLOCK)
        self.buf, self.offset, self.base = self.buf[shift:] + block, self.offset + shift, 0
        return bool(block), shift

    def drop_to(self, pos: int) -> None:
        """Mark the bytes before `pos` used (counting their lines)."""
        newlines = self.buf.count(b"\n", self.base, pos)
        if newlines:
            self.lines += newlines
            self.line_start = self.offset + self.buf.rindex(b"\n", self.base, pos) + 1
        self.base = pos

    def skip_space(self) -> None:
        """Mark the spaces at `base` used, reading on while nothing else is left."""
        while True:
            rest = len(self.buf) - self.base - len(self.buf[self.base:].lstrip(_SPACE))
            self.drop_to(self.base + rest)
            if self.base < len(self.buf) or not self.more()[0]:
                return

    def open_list(self) -> None:
        self.skip_space()
        first = self.buf[self.base:self.base + 1]
        if first != b"[":
            what = {b"{": "an object", b'"': "a string", b"t": "a boolean", b"f": "a boolean", b"n": "null",
                    b"": "nothing"}.get(first, "a number" if first and first in b"-0123456789" else "no JSON")
            raise JSONListError(f"a JSON file must hold a list of objects, not {what}")
        self.drop_to(self.base + 1)

    def element(self, end: int) -> Element:
        raw = Element(self.buf[self.base:end])
        raw.line, raw.column = self.where(self.base)
        return raw

    def where(self, pos: int) -> tuple[int, int]:
        """The 1-based line and column (in bytes) of `buf[pos]` in the file."""
        newlines = self.buf.count(b"\n", self.base, pos)
        line_start = self.offset + self.buf.rindex(b"\n", self.base, pos) + 1 if newlines else self.line_start
        return self.lines + newlines, self.offset + pos - line_start + 1

    def expect_end(self) -> None:
        """Only spaces may follow the list."""
        self.skip_space()
        if self.base < len(self.buf):
            raise self.syntax_error(self.base, "extra data after the list", parse=False)

    def syntax_error(self, pos: int, why: str, *, parse: bool = True) -> JSONListError:
        """A message at `buf[pos]`; with `parse`, the JSON error of the unfinished element there if it has one."""
        line, column = self.where(pos)
        try:
            if parse:
                json.loads(self.buf[pos:].decode("utf-8", "replace"))
        except json.JSONDecodeError as e:
            why = e.msg
            line, column = line + e.lineno - 1, (column + e.colno - 1 if e.lineno == 1 else e.colno)
        except (ValueError, RecursionError):
            pass
        return JSONListError(f"invalid JSON at line {line} column {column}: {why}")
