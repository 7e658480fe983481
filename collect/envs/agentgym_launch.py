"""Run AgentGym's real TextCraft server as a local process: for the tests and the `make agentgym-pipeline` target.

AgentGym's server is third-party code that trajlake talks to over HTTP and never imports. It reads its recipes
from the relative folder `agentenv_textcraft/recipes`, so it must run with its source folder (the one holding
`agentenv_textcraft/`) as the working directory. Its own launcher binds 0.0.0.0 by default; this one always
binds 127.0.0.1.

    with textcraft_server(source) as server:  # source: AgentGym's agentenv-textcraft folder
        env = make_env("agentgym/textcraft", url=server.url)
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import requests

from trajlake.core.errors import TrajlakeError
from trajlake.core.paths import shared_dir

#: Where the TextCraft server's source is looked for when no folder is given: $TRAJLAKE_TEXTCRAFT_SERVER, else
#: agentgym/agentenv-textcraft in the shared folder (core.paths.shared_dir: $TRAJLAKE_SHARED or ../shared).
SOURCE_ENV = "TRAJLAKE_TEXTCRAFT_SERVER"
_SIBLING = shared_dir() / "agentgym" / "agentenv-textcraft"
_LAUNCH = "from agentenv_textcraft import launch; launch()"


def textcraft_source(source: str | Path | None = None) -> Path:
    """The TextCraft server's source folder; TrajlakeError saying what is missing when there is none."""
    path = Path(source or os.environ.get(SOURCE_ENV) or _SIBLING)
    if not (path / "agentenv_textcraft" / "recipes").is_dir():
        raise TrajlakeError(f"no AgentGym TextCraft server at {path} (expected agentenv_textcraft/recipes there; "
                            f"set {SOURCE_ENV} to AgentGym's agentenv-textcraft folder)")
    return path


def server_missing_reason(source: str | Path | None = None) -> str | None:
    """Why the TextCraft server cannot start here (no source, or fastapi/uvicorn/gymnasium missing), else None."""
    try:
        textcraft_source(source)
    except TrajlakeError as e:
        return str(e)
    for module in ("fastapi", "uvicorn", "gymnasium"):
        try:
            __import__(module)
        except ImportError:
            return f"the TextCraft server needs {module} (make setup installs it)"
    return None


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class RunningServer:
    """A server process started here: its URL and the process (tests pause it to test timeouts)."""

    url: str
    process: subprocess.Popen


@contextlib.contextmanager
def textcraft_server(source: str | Path | None = None, port: int | None = None, *, log: str | Path | None = None,
                     start_timeout: float = 60.0) -> Iterator[RunningServer]:
    """Start the real TextCraft server on 127.0.0.1 and yield it (`.url`); stop it on exit.

    Its output goes to `log` (default: discarded). TrajlakeError if it exits or does not answer `GET /` within
    `start_timeout` seconds.
    """
    src = textcraft_source(source)
    port = port or free_port()
    url = f"http://127.0.0.1:{port}"
    out = open(log, "ab") if log else subprocess.DEVNULL  # noqa: SIM115  (closed below)
    proc = subprocess.Popen([sys.executable, "-c", _LAUNCH, "--host", "127.0.0.1", "--port", str(port)],
                            cwd=src, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        _wait_until_up(proc, url, start_timeout)
        yield RunningServer(url, proc)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if log:
            out.close()


def _wait_until_up(proc: subprocess.Popen, url: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise TrajlakeError(f"the TextCraft server exited with code {proc.returncode} before answering at {url}")
        try:
            if requests.get(url + "/", timeout=1).status_code == 200:
                return
        except requests.RequestException:  # not listening yet: ask again
            time.sleep(0.2)
            continue
        time.sleep(0.2)
    raise TrajlakeError(f"the TextCraft server did not answer at {url} within {timeout:g}s")
