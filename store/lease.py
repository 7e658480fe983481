"""One live process per run id, on every catalog: a lease row in the store's `run_leases` table.

Two processes running one run id would both write its checkpoints into one folder and its rows into one run
(on a SQLite or PostgreSQL catalog nothing else stops them; a DuckDB-file lake admits one process at a time, but a
process killed there leaves its lease behind all the same). So a process that is about to write a run first
takes its lease: in one store transaction (one snapshot, with a commit message) it reads the run's lease row and
writes its own when there is none, or when the holder is gone: on this host, with a pid that is not running or
that now belongs to another process (another start time). A holder that is alive, or on another host (whose
processes cannot be seen from here), refuses the second process in one line naming it. The lease is released
when the run ends, fails or is interrupted; a process killed outright leaves it, and the next one takes it over.

`check` reads only: the loops call it before any work, so a second process is refused at once and a refused
command writes nothing; `acquire` runs when the first write is due.
"""

from __future__ import annotations

import os
import secrets
import socket
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from trajlake.core.clock import utc_now
from trajlake.core.errors import TrajlakeError
from trajlake.store.attach import ALIAS
from trajlake.store.lake import Lake
from trajlake.store.write import WRITE_TOKEN

TABLE = "run_leases"
COLUMNS = ("run_id", "stage", "host", "pid", "process_start", "token", "acquired_at")


class RunLeasedError(TrajlakeError):
    """Another live process (or one on another host) holds the run's lease."""


@dataclass(frozen=True)
class Holder:
    """Who holds a lease: the host, the pid and when that process started (`process_start`: the boot id and
    start time in clock ticks, so a pid reused after the holder died, or after a reboot, is told apart)."""

    host: str
    pid: int
    process_start: str | None
    token: str
    stage: str | None = None
    acquired_at: datetime | None = None

    def describe(self) -> str:
        since = f" since {self.acquired_at:%Y-%m-%d %H:%M:%S} UTC" if self.acquired_at else ""
        return f"{self.stage or 'a'} process {self.pid} on host {self.host}{since}"


def process_start(pid: int) -> str | None:
    """An identity of the running process `pid` that a reused pid does not share (None: not running, or not
    knowable here). Linux: the boot id and the start time in ticks since boot (/proc/PID/stat field 22)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return None
    return f"{boot}:{stat.rsplit(')', 1)[1].split()[19]}"  # after the command name, which may hold spaces


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # running, as another user
        return True
    return True


def is_live(holder: Holder, host: str | None = None) -> bool:
    """Whether `holder` may still be running: always for another host (it cannot be checked from here); on this
    host, when its pid runs and (where start times are known) is the same process that took the lease."""
    if holder.host != (host or socket.gethostname()):
        return True
    if not _alive(holder.pid):
        return False
    now = process_start(holder.pid)
    return holder.process_start is None or now is None or now == holder.process_start


def me(stage: str) -> Holder:
    pid = os.getpid()
    return Holder(socket.gethostname(), pid, process_start(pid), secrets.token_hex(16), stage, utc_now())


def holder_of(lake: Lake, run_id: str) -> Holder | None:
    """The lease row of `run_id`, or None."""
    rows = lake.query(f"SELECT {', '.join(COLUMNS)} FROM {TABLE} WHERE run_id = ?", [run_id]).to_dicts()
    return _holder(rows[0]) if rows else None


def _holder(row: dict[str, Any]) -> Holder:
    return Holder(row["host"], int(row["pid"]), row["process_start"], row["token"], row["stage"], row["acquired_at"])


def _refusal(run_id: str, holder: Holder) -> RunLeasedError:
    here = holder.host == socket.gethostname()
    how = (f"wait for it to end or stop it (kill {holder.pid})" if here else
           f"wait for it to end or stop it there; if that host is gone for good, release the lease with "
           f"`trajlake --lake LAKE lease release {run_id}`")
    return RunLeasedError(f"run {run_id} is being run by {holder.describe()}: one process per run id; {how}, then "
                          "run it again (the same run id resumes it)")


def check(lake: Lake, run_id: str) -> None:
    """Raise RunLeasedError when a live process holds `run_id`'s lease. Reads only."""
    holder = holder_of(lake, run_id)
    if holder is not None and is_live(holder):
        raise _refusal(run_id, holder)


@dataclass
class Lease:
    """A held lease: `release()` (or leaving the `with` block) gives it back."""

    lake: Lake
    run_id: str
    holder: Holder
    took_over: Holder | None = None  # the dead holder it replaced, if any
    released: bool = False

    def release(self) -> None:
        """Delete this process's lease row (not one another process took over since), in one snapshot."""
        if self.released:
            return
        self.released = True
        lake, run_id, token = self.lake, self.run_id, self.holder.token

        def write(cur) -> bool:
            _serialise(lake, cur)
            n = cur.execute(f"DELETE FROM {ALIAS}.{TABLE} WHERE run_id = ? AND token = ?", [run_id, token])
            return bool(n.fetchone()[0])

        lake._transaction(write, stage=self.holder.stage or "lease", run_id=run_id,
                          message=f"{self.holder.stage}: release the lease of run {run_id}")

    def __enter__(self) -> Lease:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()


def _serialise(lake: Lake, cur) -> None:
    """On a multi-process catalog, update the write token as every append does: DuckLake lets two transactions
    insert into one table without conflict, so two takers could both see no lease; two updates of the token
    conflict at commit instead, and the loser retries, reading the winner's lease."""
    if lake.catalog.multi_process:
        cur.execute(f"UPDATE {ALIAS}.{WRITE_TOKEN} SET n = n + 1")


def acquire(lake: Lake, run_id: str, stage: str) -> Lease:
    """Take `run_id`'s lease for this process, in one transaction: refused (RunLeasedError, nothing written)
    when a live process holds it; a dead holder's lease is taken over."""
    mine = me(stage)
    found: list[Holder | None] = [None]

    def write(cur) -> bool:
        _serialise(lake, cur)
        rows = cur.execute(f"SELECT {', '.join(COLUMNS)} FROM {ALIAS}.{TABLE} WHERE run_id = ?", [run_id]).fetchall()
        found[0] = _holder(dict(zip(COLUMNS, rows[0], strict=True))) if rows else None
        if found[0] is not None:
            if is_live(found[0]):
                return False  # rolled back: refused below, nothing written
            cur.execute(f"DELETE FROM {ALIAS}.{TABLE} WHERE run_id = ?", [run_id])
        cur.execute(f"INSERT INTO {ALIAS}.{TABLE} ({', '.join(COLUMNS)}) VALUES (?, ?, ?, ?, ?, ?, ?)",
                    [run_id, stage, mine.host, mine.pid, mine.process_start, mine.token, mine.acquired_at])
        return True

    what = f"{stage}: lease run {run_id} to process {mine.pid} on {mine.host}"
    snapshot = lake._transaction(write, stage=stage, run_id=run_id, message=what)
    if snapshot is None:
        raise _refusal(run_id, found[0])
    return Lease(lake, run_id, mine, took_over=found[0])


def release_any(lake: Lake, run_id: str) -> Holder | None:
    """Remove `run_id`'s lease whoever holds it (for a holder on a host that is gone); returns who held it."""
    holder = holder_of(lake, run_id)
    if holder is not None:
        Lease(lake, run_id, holder).release()
    return holder
