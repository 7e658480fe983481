"""The table printed after a collect run; every number is read back from the store (store.reads).

Episodes that ended in an env error (a dead env server, an env bug) say nothing about the policy: they are left
out of every rate and mean, and counted on their own: `errors` are the (task, sample) pairs whose every episode
ended in an env error (a resume with the same run id retries them), `errors_retried` the errored episodes whose
pair a resume has since played.
"""

from __future__ import annotations

from trajlake.core.display import emit_vertical
from trajlake.store.reads import collect_summary as run_summary
from trajlake.store.reads import run_errors


def print_summary(lake, run_id: str) -> None:
    """One column per env, one row per metric (the metrics do not fit a terminal side by side)."""
    emit_vertical(run_summary(lake, run_id), key="env")


def errors_line(lake, run_id: str) -> str | None:
    """The line that ends a collect run some of whose episodes ended in env errors (None when none did)."""
    errors = run_errors(lake, run_id)
    if not errors.errored:
        return None
    return (f"{errors.errored} of {errors.pairs} episodes ended with an env error (e.g. {errors.example}) and are "
            f"not counted: re-run with --run-id {run_id} to retry them")


__all__ = ["errors_line", "print_summary", "run_summary"]
