"""Progress on stderr, readable wherever stderr goes (stdout is for results).

On a terminal, a live rich bar. Anywhere else (a log file, a pipe, CI, `nohup`) a live bar shows nothing until
it ends, and then a line cut to 80 columns, so there each update due is one plain, complete line instead:
`NAME WHAT DONE/TOTAL  STATS  ELAPSEDs`, when DONE is a multiple of `every` and `interval` seconds have passed
since the last line, and always the last (when the work is done, or when the block ends before).
"""

from __future__ import annotations

import time

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.text import Text


class StepProgress:
    """The progress of `total` steps of one piece of work, named `name` (`collect`, `train`...) and `what` (a
    run id); a context manager, on `console` (default: stderr's). `enabled` False: silent. `stats`: rich markup,
    shown plain in lines."""

    def __init__(self, name: str, what: str, total: int, *, enabled: bool = True, done: int = 0, every: int = 1,
                 interval: float = 0.0, console: Console | None = None):
        console = console or Console(stderr=True)
        self.enabled = enabled
        self.lines = enabled and not console.is_terminal  # plain lines where a live bar cannot be seen
        self.name, self.what, self.total = name, what, total
        self.every, self.interval = max(1, every), max(0.0, interval)
        self.completed = self.printed = done
        self.stats = ""
        self.t0 = self.last = time.perf_counter()
        self.progress = Progress(
            TextColumn(f"[bold]{escape(name)}[/bold] {{task.description}}"), BarColumn(), MofNCompleteColumn(),
            TextColumn("{task.fields[stats]}"), TimeElapsedColumn(), disable=not enabled or self.lines,
            transient=False, console=console,
        )
        self.task = self.progress.add_task(escape(what), total=total, completed=done, stats="")

    def __enter__(self):
        self.progress.__enter__()
        return self

    def __exit__(self, *exc):
        if self.lines and self.completed != self.printed:  # stopped between lines: where it got to
            self._line()
        self.progress.__exit__(*exc)

    def update(self, completed: int | None = None, *, advance: int = 0, stats: str | None = None) -> None:
        """`completed` steps done (or `advance` more); `stats` (rich markup) describes the work so far."""
        self.completed = (self.completed if completed is None else completed) + advance
        if stats is not None:
            self.stats = stats
        self.progress.update(self.task, completed=self.completed, stats=self.stats)
        if not self.lines:
            return
        now = time.perf_counter()
        last = self.total is not None and self.completed >= self.total
        if last or (self.completed % self.every == 0 and now - self.last >= self.interval):
            self._line(now)

    def print(self, markup: str) -> None:
        """A line of its own (a warning), shown however the progress is (above a live bar, among the lines, or
        with the progress off)."""
        self.progress.console.print(markup, markup=True, highlight=False, soft_wrap=True)

    def _line(self, now: float | None = None) -> None:
        now = now or time.perf_counter()
        self.last, self.printed = now, self.completed
        stats = Text.from_markup(self.stats).plain if self.stats else ""
        parts = [f"{self.name} {self.what} {self.completed}/{self.total}", stats, f"{now - self.t0:.0f}s"]
        out = self.progress.console.file
        out.write("  ".join(p for p in parts if p) + "\n")
        out.flush()


__all__ = ["StepProgress"]
