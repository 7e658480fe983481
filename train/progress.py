"""The train progress bar: iterations (or SFT steps) done and the main metrics of the last one.

On a terminal it is a live bar; anywhere else (a log file, CI, `nohup`) a bar is drawn only once, at the end,
so there it prints one plain line per update instead (every `every` steps, and the last), to stderr
(core/progress.py).
"""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape

from trajlake.core.progress import StepProgress

#: metric -> label, in the order shown
SHOWN = {"reward_mean": "reward", "success_mean": "success", "outcome_groups": "groups+-", "signal_rows": "signal",
         "eval_success": "eval",
         "loss": "loss",
         "pg_loss": "pg", "critic_vf_loss": "vf", "nll": "nll", "kl": "kl", "entropy": "ent",
         "pg_clipfrac": "clip", "grad_norm": "|g|", "train_tokens_per_s": "tok/s"}


#: iterations in a row without a learning signal before the run warns
NO_SIGNAL_WARN = 3


def no_signal_cause(metrics: dict, temperature: float) -> str:
    """Why no group of an iteration had an outcome difference, from its metrics: the likely cause and what to
    change."""
    success = metrics.get("success_mean")
    if success == 0:
        return ("no episode succeeded: warm-start the policy (SFT), play tasks it sometimes wins (task_selector "
                "learnable), or lower the sampling temperature if it breaks the policy")
    if success == 1:
        return "every episode succeeded: the tasks are solved; play harder tasks (difficulty) or stop"
    return (f"each task's samples all won or all lost: raise the samples per task or the temperature (now "
            f"{temperature:g}), or play tasks the policy sometimes wins (task_selector learnable)")


class NoSignalStreak:
    """Counts the iterations in a row without an outcome signal (no group whose samples' success differs, so
    no outcome gradient, whatever the shaping terms did) and, from the NO_SIGNAL_WARN-th on, says why in the
    iteration's metrics (`no_signal_streak`, `warning`)."""

    def __init__(self, temperature: float) -> None:
        self.temperature, self.count = temperature, 0

    def update(self, metrics: dict) -> str | None:
        """Record `metrics`' iteration; the warning added to them, if any."""
        self.count = self.count + 1 if metrics.get("outcome_groups", 1.0) == 0 else 0
        metrics["no_signal_streak"] = self.count
        if self.count < NO_SIGNAL_WARN:
            return None
        groups = int(metrics.get("groups", 0))
        trained = "nothing trained" if metrics.get("signal_rows", 0) == 0 else "only shaping rewards trained on"
        metrics["warning"] = (f"{self.count} iterations in a row without an outcome signal (0 of {groups} groups "
                              f"had samples that differ in success; {trained}): "
                              f"{no_signal_cause(metrics, self.temperature)}")
        return metrics["warning"]


def _fmt(v: float) -> str:
    return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.3g}"


class TrainProgress:
    def __init__(self, total: int, *, enabled: bool, run_id: str, done: int = 0, every: int = 1,
                 console: Console | None = None):
        self.run_id = run_id
        self.bar = StepProgress("train", run_id, total, enabled=enabled, done=done, every=every, console=console)

    def __enter__(self):
        self.bar.__enter__()
        return self

    def __exit__(self, *exc):
        self.bar.__exit__(*exc)

    def warn(self, message: str) -> None:
        """A warning line, shown however the progress is (bar or lines)."""
        self.bar.print(f"[yellow]warning:[/yellow] train {escape(self.run_id)}: {escape(message)}")

    def update(self, completed: int, metrics: dict) -> None:
        stats = "  ".join(f"{label} {_fmt(metrics[k])}" for k, label in SHOWN.items()
                          if isinstance(metrics.get(k), (int, float)))
        self.bar.update(completed, stats=escape(stats))
