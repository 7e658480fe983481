"""What every recipe's command line shares: the parser with `--lake`, `--format` and `--debug` (as `trajlake`'s
global options), integer overrides of config fields, and running the recipe with a refused setting or failed
stage printed as one `error:` line (exit 1)."""

from __future__ import annotations

import argparse
import signal
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from trajlake.core.display import TableFormat, set_table_format
from trajlake.core.errors import TrajlakeError
from trajlake.core.quiet import debug, set_debug


def recipe_parser(module: str, doc: str | None) -> argparse.ArgumentParser:
    """The parser of `python -m <module>`, its help the recipe's docstring, with `--lake`, `--format` and
    `--debug` (read them with `recipe_args`)."""
    parser = argparse.ArgumentParser(prog=f"python -m {module}", description=doc,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lake", default="lake", help="lake URI (default ./lake)")
    parser.add_argument("--format", choices=[f.value for f in TableFormat], default=None,
                        help="how tables print: table (default; off a terminal as wide as its values), plain, "
                             "markdown or csv")
    parser.add_argument("--debug", action="store_true", default=None,
                        help="show tracebacks on errors, and the third-party warnings and messages trajlake silences")
    return parser


def recipe_args(parser: argparse.ArgumentParser, argv: list[str] | None) -> dict[str, Any]:
    """The command line parsed: `--format` and `--debug` applied to the process (core/display.py,
    core/quiet.py) and taken out; the rest by name (None: not given)."""
    args = vars(parser.parse_args(argv))
    set_table_format(args.pop("format") or TableFormat.table)
    set_debug(bool(args.pop("debug")))
    return args


def add_overrides(parser: argparse.ArgumentParser, names: Iterable[str], kind: type = int) -> None:
    """`--kebab-name` options overriding the config fields `names` (unset: the config's own value)."""
    for name in names:
        parser.add_argument(f"--{name.replace('_', '-')}", type=kind, default=None, help=f"override {name}")


def check_folders(lake: str, **folders: Path) -> None:
    """The folders a recipe writes (`--report`, `--checkpoints`, `--models`), checked against its lake before its
    first stage as every `trajlake` output is (store/outputs.py): one line naming the option, not a report
    refused, or checkpoints written among the lake's files, after an hour of training."""
    from trajlake.store.outputs import check_output_path
    from trajlake.store.uri import parse_uri

    catalog = parse_uri(lake)
    for option, folder in folders.items():
        check_output_path(catalog, folder, f"--{option.replace('_', '-')}")


def stop_cleanly_on_sigterm() -> None:
    """A SIGTERM (`kill`, a job scheduler's stop) raises SystemExit(143) instead of ending the process at once,
    so the recipe's `finally` blocks run: the environment server it started is stopped, not left orphaned."""
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))


def run_recipe(run: Callable[[Any], Any], make_config: Callable[[], Any]) -> int:
    """`run(make_config())`; 0, or 1 after one `error:` line on stderr for a TrajlakeError (a setting the
    config refuses included; with --debug, the traceback). A SIGTERM stops it cleanly (`stop_cleanly_on_sigterm`)."""
    stop_cleanly_on_sigterm()
    try:
        run(make_config())
    except TrajlakeError as e:
        if debug():  # --debug: the traceback
            raise
        print(f"error: {e}", file=sys.stderr)
        return 1
    finally:  # --format and --debug (recipe_args) hold for this run only
        set_table_format(TableFormat.table)
        set_debug(False)
    return 0


__all__ = ["recipe_parser", "recipe_args", "add_overrides", "check_folders", "run_recipe", "stop_cleanly_on_sigterm"]
