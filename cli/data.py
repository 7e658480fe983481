"""The `trajlake` commands that move data in and out of a lake: `export` (a query's result as parquet, or
episodes as a datasets dataset) and `import agentgym` / `import dataset` (the interop/ wing's readers)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from trajlake.cli.common import PATH, check_output, open_lake, path_arg, run_id_arg
from trajlake.core import display

import_app = typer.Typer(help="Import trajectories from other tools' files.", no_args_is_help=True)

#: the caps on one imported row (interop/importers/limits.py says why these defaults)
MAX_FIELD_HELP = "Refuse a row holding a text over this many megabytes (default 1)."
MAX_ROW_HELP = "Refuse a row over this many megabytes (default 4)."


def _limits(max_field_mb: Optional[float], max_row_mb: Optional[float]):
    from trajlake.interop.importers.limits import Limits

    return Limits.from_mb(max_field_mb, max_row_mb)


def export(
    path: Path = typer.Argument(..., help="Parquet file to write (--query), or a new folder (--dataset).",
                                parser=path_arg, metavar=PATH),
    query: Optional[str] = typer.Option(None, "--query", "-q", help="SQL whose result is exported."),
    dataset: bool = typer.Option(False, "--dataset", help="Export episodes as a Hugging Face datasets dataset "
                                 "(messages, conversations, token ids, masks, log-probs, rewards, turns)."),
    where: str = typer.Option("true", "--where", help="With --dataset: SQL over episodes columns."),
    spec: Optional[Path] = typer.Option(None, "--spec", help="With --dataset: a reward spec for the reward and "
                                        "token_rewards columns (scored first where not yet).",
                                        parser=path_arg, metavar=PATH),
    snapshot: Optional[int] = typer.Option(None, "--snapshot", "-s"),
) -> None:
    """Export a read-only query's result to a parquet file, or episodes as a datasets dataset
    (datasets.load_from_disk(PATH), or PATH/episodes.parquet) that `trajlake import dataset` reads back."""
    if dataset == (query is not None):
        raise typer.BadParameter("give --query SQL (a parquet file) or --dataset (a datasets folder), not both")
    if not dataset:
        if where != "true" or spec is not None:
            raise typer.BadParameter("--where and --spec go with --dataset")
        with open_lake(read_only=True) as lake:
            check_output(lake, path, "export")
            display.emit(lake.query(query, snapshot=snapshot), display.Format.parquet, path)
        return
    from trajlake.interop.hf_dataset import export_dataset
    from trajlake.rewards import load_spec

    loaded = load_spec(spec) if spec else None
    with open_lake(read_only=spec is None) as lake:  # scoring with a spec writes its rewards first
        check_output(lake, path, "export --dataset")
        n = export_dataset(lake, path, where, spec=loaded, snapshot=snapshot)
    display.console.print(f"{n} episodes exported to {path} (datasets.load_from_disk, or {path}/episodes.parquet)")


@import_app.command("agentgym")
def import_agentgym(
    paths: list[Path] = typer.Argument(..., help="Parquet, JSON or JSONL files in OpenManus-RL/AgentGym format.",
                                       parser=path_arg, metavar="PATHS..."),
    tokenizer: Path = typer.Option(..., "--tokenizer", help="Tokenizer folder (a model saved with save_pretrained).",
                                   parser=path_arg, metavar=PATH),
    run_id: Optional[str] = typer.Option(None, "--run-id", callback=run_id_arg),
    env: Optional[str] = typer.Option(
        None, "--env", help="Env the episodes are stored under (default: data_source), e.g. agentgym/textcraft."),
    split: Optional[str] = typer.Option(None, "--split", help="Split when the files do not say."),
    max_field_mb: Optional[float] = typer.Option(None, "--max-field-mb", help=MAX_FIELD_HELP, show_default=False),
    max_row_mb: Optional[float] = typer.Option(None, "--max-row-mb", help=MAX_ROW_HELP, show_default=False),
) -> None:
    """Import OpenManus-RL / AgentGym trajectories as episodes and turns with exact token ids."""
    from trajlake.interop.importers.agentgym import check_labels
    from trajlake.interop.importers.agentgym import import_agentgym as run_import

    # checked before the lake opens: an empty --run-id was replaced by a generated one, an empty --env or
    # --split by the file's own (the user's word must be used as given, or refused)
    check_labels(run_id=run_id, env=env, split=split, what="--{}")
    limits = _limits(max_field_mb, max_row_mb)
    with open_lake() as lake:
        result = run_import(lake, paths, tokenizer, run_id=run_id, env=env, split=split, limits=limits)
    display.console.print(str(result))


@import_app.command("dataset")
def import_dataset(
    path: Path = typer.Argument(..., help="A folder `trajlake export --dataset` wrote (or its parquet files).",
                                parser=path_arg, metavar=PATH),
    max_field_mb: Optional[float] = typer.Option(None, "--max-field-mb", help=MAX_FIELD_HELP, show_default=False),
    max_row_mb: Optional[float] = typer.Option(None, "--max-row-mb", help=MAX_ROW_HELP, show_default=False),
) -> None:
    """Store the episodes of an exported datasets dataset (with their turns, runs and tasks); those already
    stored are skipped."""
    from trajlake.interop.hf_dataset import import_dataset as run_import

    limits = _limits(max_field_mb, max_row_mb)
    with open_lake() as lake:
        got = run_import(lake, path, limits=limits)
    display.console.print(", ".join(f"{k}: {v}" for k, v in got.items()))


def register(app: typer.Typer) -> None:
    app.command()(export)
    app.add_typer(import_app, name="import")
