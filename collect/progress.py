"""The collect progress bar: episodes done, success so far, agent tokens per second."""

from __future__ import annotations

import time

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn


class CollectProgress:
    def __init__(self, total: int, *, enabled: bool, run_id: str):
        self.total, self.enabled = total, enabled
        self.done = self.success = self.tokens = 0
        self.t0 = time.perf_counter()
        self.progress = Progress(
            TextColumn("[bold]collect[/bold] {task.description}"), BarColumn(), MofNCompleteColumn(),
            TextColumn("success {task.fields[rate]}"), TextColumn("{task.fields[tps]} tok/s"),
            TimeElapsedColumn(), disable=not enabled, transient=False,
        )
        self.task = self.progress.add_task(run_id, total=total, rate="-", tps="-")

    def __enter__(self):
        self.progress.__enter__()
        return self

    def __exit__(self, *exc):
        self.progress.__exit__(*exc)

    def episode_done(self, success: bool, agent_tokens: int) -> None:
        self.done += 1
        self.success += int(success)
        self.tokens += agent_tokens
        tps = self.tokens / max(time.perf_counter() - self.t0, 1e-9)
        self.progress.update(self.task, advance=1, rate=f"{self.success / self.done:.0%}", tps=f"{tps:,.0f}")
