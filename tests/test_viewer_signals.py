"""Ctrl-C stops the served viewer, also when its process inherited SIGINT ignored (a non-interactive shell's
background job: `trajlake view &` in a script), on a real `trajlake view` process. Before, the second kind
served on for good. The bound is loose (a loaded machine delays any process); idle, the port closes in well
under a second."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from trajlake.store import Lake


@pytest.fixture(scope="module")
def lake_uri(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("viewer-signals") / "lake.ducklake"
    with Lake.open(str(path)):
        pass
    return str(path)


def _ignore_sigint() -> None:  # what a non-interactive shell does to a background job
    signal.signal(signal.SIGINT, signal.SIG_IGN)


@pytest.mark.parametrize("inherited", ["default", "ignored"])
def test_sigint_stops_the_served_viewer(lake_uri, inherited):
    proc = subprocess.Popen([sys.executable, "-m", "trajlake", "--lake", lake_uri, "view", "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "COLUMNS": "200"},
                            preexec_fn=_ignore_sigint if inherited == "ignored" else None)
    try:
        line = proc.stdout.readline()  # printed once the socket listens
        assert "trajlake viewer at http://127.0.0.1:" in line, (line, proc.stderr.read() if proc.poll() else "")
        port = int(line.split("127.0.0.1:")[1].split("/")[0])
        sent = time.monotonic()
        proc.send_signal(signal.SIGINT)
        while _listening(port) and time.monotonic() - sent < 10:
            time.sleep(0.05)
        assert not _listening(port), "still serving 10 s after Ctrl-C"
        assert proc.wait(timeout=10) == 0  # then the process ends: its lake closed, the interpreter torn down
        assert "Traceback" not in proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0
