"""How an env server's reply is read: bounded in size and time, and what a failed request is.

Env servers are untrusted. requests reads a reply's body whole, however large, and its read timeout bounds only
the wait between two bytes: a server sending gigabytes, or a byte a minute, held a collector and its memory.
`read_bounded` reads a streamed reply as it arrives, to `MAX_REPLY_BYTES` and within the timeout from its start.
"""

from __future__ import annotations

import re
import time
from typing import Any

import requests
import urllib3

from trajlake.core.errors import TrajlakeError


class EnvServerError(TrajlakeError):
    """An env server replied with an error, an unreadable reply, or could not be reached in time.

    The message names the method and URL and says what happened. `status` is the HTTP status when there was a
    reply (AgentGym servers send their errors as HTTP 200 `{"error": ...}`), None when there was none.
    """

    def __init__(self, message: str, status: int | None = None):
        super().__init__(message)
        self.status = status


#: the largest reply body read from an env server (an observation is text: TextCraft's are under 2 KiB, a WebShop
#: page tens of KiB); a larger one ends the episode as an env error
MAX_REPLY_BYTES = 16 << 20


def read_bounded(r: requests.Response, method: str, url: str, timeout: float) -> None:
    """Read `r`'s body (a streamed reply) into `r.content`, refusing one larger than MAX_REPLY_BYTES or still
    arriving `timeout` seconds after its headers: requests reads a body whole, however large, and its read timeout
    bounds only the wait between two bytes, so a server sending gigabytes, or a byte a minute, held a collector
    (and its memory) without end."""
    deadline = time.monotonic() + timeout
    chunks, size = [], 0
    try:
        for chunk in _chunks(r, method, url):
            size += len(chunk)
            if size > MAX_REPLY_BYTES:
                raise EnvServerError(f"{method} {url}: the reply is larger than {MAX_REPLY_BYTES >> 20} MiB, "
                                     "more than an env's observation holds", r.status_code)
            if time.monotonic() > deadline:
                raise EnvServerError(f"{method} {url}: the reply was still arriving {timeout:g}s after it began",
                                     r.status_code)
            chunks.append(chunk)
    finally:
        r.close()
    r._content = b"".join(chunks)  # what `r.content` would have read: r.text and r.json() use it


def _chunks(r: requests.Response, method: str, url: str):
    """`r`'s body in the pieces it arrives in (urllib3's read1: one read of the socket each, so a server sending a
    byte at a time is seen at every byte, where `iter_content` waits for a whole chunk); a reply that breaks off
    is an EnvServerError (not retried: the server answered)."""
    try:
        while chunk := r.raw.read1(64 << 10, decode_content=True):
            yield chunk
    except (requests.RequestException, urllib3.exceptions.HTTPError, OSError) as e:
        raise EnvServerError(f"{method} {url}: the reply broke off ({reason(e)})", r.status_code) from e


def reason(e: Exception) -> str:
    """The useful tail of a requests error ("[Errno 111] Connection refused"), not its whole chain."""
    text = str(e)
    m = re.search(r"\[Errno -?\d+\][^'\")]*", text) or re.search(r"(Remote\w+|Connection \w+)[^'\")]*", text)
    return m.group(0).strip() if m else clip(text)


def clip(value: Any, n: int = 200) -> str:
    text = value if isinstance(value, str) else repr(value)
    return text if len(text) <= n else text[:n] + "..."


__all__ = ["MAX_REPLY_BYTES", "EnvServerError", "clip", "read_bounded", "reason"]
