"""The collect progress: episodes done, success so far, env errors, agent tokens per second; a live bar on a
terminal, elsewhere a plain line at most every LINE_EVERY_S seconds and the last (core/progress.py).

The success rate counts only episodes that played out (ok or truncated): an episode that ended in an env error
says nothing about the policy, so it is counted on its own (and retried when the run is resumed).
"""

from __future__ import annotations

import time

from trajlake.core.progress import StepProgress

#: off a terminal, a progress line at most this often (seconds), and the last
LINE_EVERY_S = 10.0


class CollectProgress:
    def __init__(self, total: int, *, enabled: bool, run_id: str, retries: int = 0, console=None,
                 interval: float = LINE_EVERY_S):
        self.total, self.enabled = total, enabled
        self.done = self.success = self.tokens = self.errors = 0
        self.t0 = time.perf_counter()
        label = f"{run_id} (retrying {retries} errored)" if retries else run_id
        self.bar = StepProgress("collect", label, total, enabled=enabled, interval=interval, console=console)

    def __enter__(self):
        self.bar.__enter__()
        return self

    def __exit__(self, *exc):
        self.bar.__exit__(*exc)

    def note(self, markup: str) -> None:
        """One line beside the progress (rich markup), when progress is shown."""
        if self.enabled:
            self.bar.print(markup)

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
        errors = f"  [red]{self.errors} env errors[/red]" if self.errors else ""
        self.bar.update(self.done, stats=f"success {rate}{errors}  {tps:,.0f} tok/s")
