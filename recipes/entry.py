"""What every recipe's command line shares: the parser with `--lake`, integer overrides of config fields, and
running the recipe with a refused setting or failed stage printed as one `error:` line (exit 1)."""

from __future__ import annotations

import argparse
import signal
import sys
from collections.abc import Callable, Iterable
from typing import Any

from trajlake.core.errors import TrajlakeError


def recipe_parser(module: str, doc: str | None) -> argparse.ArgumentParser:
    """The parser of `python -m <module>`, its help the recipe's docstring, with `--lake`."""
    parser = argparse.ArgumentParser(prog=f"python -m {module}", description=doc,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lake", default="lake", help="lake URI (default ./lake)")
    return parser


def add_overrides(parser: argparse.ArgumentParser, names: Iterable[str], kind: type = int) -> None:
    """`--kebab-name` options overriding the config fields `names` (unset: the config's own value)."""
    for name in names:
        parser.add_argument(f"--{name.replace('_', '-')}", type=kind, default=None, help=f"override {name}")


def stop_cleanly_on_sigterm() -> None:
    """A SIGTERM (`kill`, a job scheduler's stop) raises SystemExit(143) instead of ending the process at once,
    so the recipe's `finally` blocks run: the environment server it started is stopped, not left orphaned."""
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))


def run_recipe(run: Callable[[Any], Any], make_config: Callable[[], Any]) -> int:
    """`run(make_config())`; 0, or 1 after one `error:` line on stderr for a TrajlakeError (a setting the
    config refuses included). A SIGTERM stops it cleanly (`stop_cleanly_on_sigterm`)."""
    stop_cleanly_on_sigterm()
    try:
        run(make_config())
    except TrajlakeError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


__all__ = ["recipe_parser", "add_overrides", "run_recipe", "stop_cleanly_on_sigterm"]
