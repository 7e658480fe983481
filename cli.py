"""The `trajlake` command line: `trajlake [--lake URI] COMMAND`.

Each stage registers its commands here; the work itself lives in the stage packages. Errors print one
readable line and exit non-zero; `--debug` shows the traceback instead.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer

from trajlake import display
from trajlake.store import Lake, TrajlakeError

app = typer.Typer(
    name="trajlake",
    help="Trajectory lake and trainer for RL on LLM agents.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
import_app = typer.Typer(help="Import trajectories from other tools' files.", no_args_is_help=True)
model_app = typer.Typer(help="Build or convert models offline.", no_args_is_help=True)
app.add_typer(import_app, name="import")
app.add_typer(model_app, name="model")


class State:
    lake_uri: Optional[str] = None
    debug: bool = False


@app.callback()
def _global(
    lake: Optional[str] = typer.Option(
        None, "--lake", help="Lake URI: a folder, sqlite:FILE or postgres:CONNINFO [default: $TRAJLAKE_LAKE or ./lake]"
    ),
    debug: bool = typer.Option(False, "--debug", help="Show tracebacks on errors."),
) -> None:
    State.lake_uri = lake
    State.debug = debug


def open_lake() -> Lake:
    return Lake.open(State.lake_uri)


@app.command()
def sql(
    query: Optional[str] = typer.Argument(None, help="SQL over the tables; none opens an interactive shell."),
    snapshot: Optional[int] = typer.Option(None, "--snapshot", "-s", help="Read the lake as of this snapshot."),
    fmt: display.Format = typer.Option("table", "--format", "-f", help="Output format."),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="Write to this file instead of stdout."),
) -> None:
    """Run SQL on the lake (tables: tasks, runs, policies, episodes, turns, reward_specs, ...)."""
    with open_lake() as lake:
        if query is None:
            display.shell(lake, snapshot=snapshot)
            return
        display.emit(lake.query(query, snapshot=snapshot), fmt, out)


@app.command()
def snapshots() -> None:
    """List the lake's snapshots: id, time, stage, message, run id."""
    with open_lake() as lake:
        display.emit(lake.snapshots().drop("changes"), display.Format.table, None, max_rows=10_000)


@app.command()
def tables() -> None:
    """List the tables with their row counts."""
    from trajlake.schemas import TABLES

    with open_lake() as lake:
        counts = " UNION ALL ".join(f"SELECT '{t}' AS table_name, count(*) AS rows FROM {t}" for t in TABLES)
        display.emit(lake.query(counts), display.Format.table, None)


@app.command()
def export(
    path: Path = typer.Argument(..., help="Parquet file to write."),
    query: str = typer.Option(..., "--query", "-q", help="SQL whose result is exported."),
    snapshot: Optional[int] = typer.Option(None, "--snapshot", "-s"),
) -> None:
    """Export a query's result to a parquet file."""
    with open_lake() as lake:
        display.emit(lake.query(query, snapshot=snapshot), display.Format.parquet, path)


@app.command()
def maintain(
    expire_older_than: Optional[str] = typer.Option(
        None, "--expire-older-than", help="Expire snapshots older than this (e.g. 30d, 12h); none: keep all."
    ),
    grace: str = typer.Option("1h", "--grace", help="Never delete files younger than this (live writers)."),
) -> None:
    """Flush inlined rows, merge small files, expire old snapshots, delete unused files."""
    expire = display.parse_duration(expire_older_than) if expire_older_than else None
    with open_lake() as lake:
        done = lake.maintain(expire_older_than=expire, grace=display.parse_duration(grace))
    display.console.print(", ".join(f"{k}: {v}" for k, v in done.items()))


@import_app.command("agentgym")
def import_agentgym(
    paths: list[Path] = typer.Argument(..., help="Parquet, JSON or JSONL files in OpenManus-RL/AgentGym format."),
    tokenizer: Path = typer.Option(..., "--tokenizer", help="Tokenizer folder (a model saved with save_pretrained)."),
    run_id: Optional[str] = typer.Option(None, "--run-id"),
    env: Optional[str] = typer.Option(None, "--env", help="Env name when the files do not say."),
    split: Optional[str] = typer.Option(None, "--split", help="Split when the files do not say."),
) -> None:
    """Import OpenManus-RL / AgentGym trajectories as episodes and turns with exact token ids."""
    from trajlake.collect.importers.agentgym import import_agentgym as run_import

    with open_lake() as lake:
        result = run_import(lake, paths, tokenizer, run_id=run_id, env=env, split=split)
    display.console.print(str(result))


@model_app.command("tiny")
def model_tiny(
    out: Path = typer.Option(..., "--out", help="Folder to save the model and tokenizer in."),
    seed: int = typer.Option(0, "--seed"),
) -> None:
    """Build a ~1M-parameter Llama with a byte-level BPE chat tokenizer, offline, in seconds."""
    from trajlake.collect.models import build_tiny_model, model_summary

    path = build_tiny_model(out, seed=seed)
    summary = model_summary(path)
    display.console.print(f"saved {path}: " + ", ".join(f"{k} {v}" for k, v in summary.items()))


def main(argv: list[str] | None = None) -> int:
    """Entry point: run the CLI, turning errors into one line and a non-zero exit."""
    command = typer.main.get_command(app)
    args = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in args
    try:
        command.main(args=args, prog_name="trajlake", standalone_mode=False)
    except typer.Exit as e:
        return e.exit_code
    except typer.Abort:
        print("aborted", file=sys.stderr)
        return 130
    except typer.TyperException as e:  # usage errors: typer shows them with the usage line
        e.show()
        return getattr(e, "exit_code", 2)
    except (TrajlakeError, OSError, ValueError, KeyError) as e:
        if debug:
            raise
        msg = e.args[0] if isinstance(e, KeyError) and e.args else str(e)
        print(f"error: {msg}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
