"""The `trajlake rewards` commands: score stored episodes with a reward spec (`rewards`, a replay that stores
each spec's scores beside the others), or compare two specs (`rewards diff`)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from trajlake.cli.common import PATH, check_count, open_lake, path_arg
from trajlake.core import display

#: the most episodes `rewards diff --top` lists (its LIMIT; DuckDB refused a negative or a non-BIGINT one only
#: after both specs' scores were stored)
MAX_TOP = 100_000

rewards_app = typer.Typer(help="Score stored episodes with a reward spec (replay), or compare two specs.")


@rewards_app.callback(invoke_without_command=True)
def rewards(
    ctx: typer.Context,
    spec: Optional[Path] = typer.Option(None, "--spec", help="Reward spec TOML (default: the built-in default).",
                                        parser=path_arg, metavar=PATH),
    snapshot: Optional[int] = typer.Option(None, "--snapshot", "-s", help="Score the lake as of this snapshot."),
    where: Optional[str] = typer.Option(None, "--where", help="SQL filter over episodes columns."),
) -> None:
    """Score every matching stored episode with a spec; re-running the same spec is a no-op."""
    if ctx.invoked_subcommand is not None:
        return
    from trajlake.rewards import default_spec, load_spec
    from trajlake.rewards.score import score

    loaded = load_spec(spec) if spec else default_spec()
    with open_lake() as lake:
        display.console.print(str(score(lake, loaded, snapshot=snapshot, where=where)))
        display.show(lake.query(
            "SELECT count(*) AS episodes, round(avg(total), 4) AS mean_total, round(min(total), 4) AS min, "
            "round(max(total), 4) AS max FROM episode_rewards WHERE spec_id = ?", [loaded.spec_id]))


@rewards_app.command("diff")
def rewards_diff(
    spec_a: Path = typer.Argument(..., help="The old spec.", parser=path_arg, metavar="SPEC_A"),
    spec_b: Path = typer.Argument(..., help="The new spec.", parser=path_arg, metavar="SPEC_B"),
    snapshot: Optional[int] = typer.Option(None, "--snapshot", "-s"),
    where: Optional[str] = typer.Option(None, "--where", help="SQL filter over episodes columns."),
    top: int = typer.Option(10, "--top", help="How many of the most changed episodes to list."),
) -> None:
    """Compare two specs: totals, success/failure means, and the episodes that change most."""
    from trajlake.rewards import load_spec
    from trajlake.rewards.score import diff

    check_count("--top", top, 0, MAX_TOP)  # before anything is scored: diff stores both specs' scores first
    a, b = load_spec(spec_a), load_spec(spec_b)
    with open_lake() as lake:
        summary, changes = diff(lake, a, b, snapshot=snapshot, where=where, top=top)
    display.console.print(f"A = {a.name} ({a.spec_id}), B = {b.name} ({b.spec_id})")
    display.emit_vertical(summary)
    display.show(changes)


def register(app: typer.Typer) -> None:
    app.add_typer(rewards_app, name="rewards")
