"""Ctrl-C on a query without end (`trajlake sql` of a recursive CTE that never stops): DuckDB interrupts the
query and raises a bare RuntimeError("Query interrupted"), which the CLI printed as an internal error asking
for a bug report. It is a Ctrl-C: "aborted", exit 130, as click reports one that lands outside a query."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest

from trajlake.store import Lake

ENDLESS = "WITH RECURSIVE t(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM t) SELECT * FROM t"


@pytest.mark.slow  # 20 s: DuckDB sees the interrupt between the recursion's steps, seconds apart
def test_ctrl_c_on_a_running_query_is_aborted_not_an_internal_error(tmp_path):
    uri = str(tmp_path / "lake")
    Lake.open(uri).close()  # a new, empty lake
    p = subprocess.Popen([sys.executable, "-m", "trajlake", "--lake", uri, "sql", ENDLESS], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:  # until the query runs: its process is busy for a while
            time.sleep(1)
            with open(f"/proc/{p.pid}/stat") as f:
                utime = int(f.read().rsplit(")", 1)[1].split()[11])
            if utime > 300:  # 3 s of CPU (in clock ticks): past the imports, inside the query
                break
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=180)
    finally:
        p.kill()
    assert p.returncode == 130, err
    assert err.strip() == "aborted", err
