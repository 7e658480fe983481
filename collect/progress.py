"""The collect progress bar: episodes done, success so far, env errors, agent tokens per second.

The success rate counts only episodes that played out (ok or truncated): an episode that ended in an env error
says nothing about the policy, so it is counted on its own (and retried when the run is resumed).
"""

from __future__ import annotations

import time

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn


class CollectProgress:
    def __init__(self, total: int, *, enabled: bool, run_id: str, retries: int = 0):
        self.total, self.enabled = total, enabled
        self.done = self.success = self.tokens = self.errors = 0
        self.t0 = time.perf_counter()
        self.progress = Progress(
            TextColumn("[bold]collect[/bold] {task.description}"), BarColumn(), MofNCompleteColumn(),
            TextColumn("success {task.fields[rate]}"), TextColumn("{task.fields[errors]}"),
            TextColumn("{task.fields[tps]} tok/s"), TimeElapsedColumn(), disable=not enabled, transient=False,
            console=Console(stderr=True),  # progress on stderr: stdout is for results
        )
        label = f"{run_id} (retrying {retries} errored)" if retries else run_id
        self.task = self.progress.add_task(label, total=total, rate="-", tps="-", errors="")

    def __enter__(self):
        self.progress.__enter__()
        return self

    def __exit__(self, *exc):
        self.progress.__exit__(*exc)

    @property
    def rate(self) -> float | None:
        """Success rate over the episodes that did not end in an env error (None before the first)."""
        played = self.done - self.errors
        return self.success / played if played else None

    def episode_done(self, success: bool, agent_tokens: int, *, error: bool = False) -> None:
        self.done += 1
        self.errors += int(error)
        self.success += int(success and not error)
        self.tokens += agent_tokens
        tps = self.tokens / max(time.perf_counter() - self.t0, 1e-9)
        rate = "-" if self.rate is None else f"{self.rate:.0%}"
        errors = f"[red]{self.errors} env errors[/red]" if self.errors else ""
        self.progress.update(self.task, advance=1, rate=rate, tps=f"{tps:,.0f}", errors=errors)
