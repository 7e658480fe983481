"""The train progress bar: iterations (or SFT steps) done and the main metrics of the last one."""

from __future__ import annotations

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

#: metric -> label, in the order shown
SHOWN = {"reward_mean": "reward", "success_mean": "success", "eval_success": "eval", "loss": "loss",
         "pg_loss": "pg", "critic_vf_loss": "vf", "nll": "nll", "kl": "kl", "entropy": "ent",
         "pg_clipfrac": "clip", "grad_norm": "|g|", "train_tokens_per_s": "tok/s"}


def _fmt(v: float) -> str:
    return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.3g}"


class TrainProgress:
    def __init__(self, total: int, *, enabled: bool, run_id: str, done: int = 0):
        self.progress = Progress(
            TextColumn("[bold]train[/bold] {task.description}"), BarColumn(), MofNCompleteColumn(),
            TextColumn("{task.fields[stats]}"), TimeElapsedColumn(), disable=not enabled, transient=False,
        )
        self.task = self.progress.add_task(run_id, total=total, completed=done, stats="")

    def __enter__(self):
        self.progress.__enter__()
        return self

    def __exit__(self, *exc):
        self.progress.__exit__(*exc)

    def update(self, completed: int, metrics: dict) -> None:
        stats = "  ".join(f"{label} {_fmt(metrics[k])}" for k, label in SHOWN.items()
                          if isinstance(metrics.get(k), (int, float)))
        self.progress.update(self.task, completed=completed, stats=stats)
