"""The `trajlake` command line: `trajlake [--lake URI] COMMAND`.

This module holds the app, its global options and its error handling; the commands live one module per group
(cli/collect.py, rewards.py, train.py, store.py, view.py, data.py, model.py), each registering its commands on
the app through its `register(app)`, and the work itself in the stage packages. Errors print one readable line
and exit non-zero; `--debug` shows the traceback instead (and the third-party chatter core/quiet.py silences).
`--format` chooses how the tables every command prints show (core/display.py).
"""

from __future__ import annotations

import inspect
import sys
from typing import Optional

import typer
from typer.core import TyperCommand, TyperGroup

from trajlake.cli import collect, data, model, rewards, store, train, view
from trajlake.cli.common import State, one_line
from trajlake.core import display, quiet
from trajlake.core.errors import TrajlakeError

#: commands made when first run (or asked for their own --help), by name, with the function whose docstring is
#: their help: `train`'s options come from TrainConfig, whose module imports torch (a second or more), and
#: collect's and evaluate's dozens of options cost typer 50 ms, which `sql`, `view` and `trajlake --help` would
#: pay. Until then the list of commands shows a stand-in carrying the command's own help text.
LAZY_COMMANDS = {"collect": (collect.collect_command, collect.collect),
                 "evaluate": (collect.evaluate_command, collect.evaluate), "train": (train.command, train.train)}

#: the order `trajlake --help` lists the commands in: the pipeline's (a command not named here comes last)
HELP_ORDER = ("collect", "evaluate", "envs", "serve-env", "rewards", "train", "sql", "tables", "snapshots", "view",
              "report", "export", "import", "lease", "maintain", "model")


class _Commands(TyperGroup):
    """The app's click group: the registered commands, and LAZY_COMMANDS', made when one is run."""

    def resolve_command(self, ctx, args: list[str]):
        if args and args[0] in LAZY_COMMANDS and not self._made(args[0]):
            self.commands[args[0]] = LAZY_COMMANDS[args[0]][0]()
        for name in LAZY_COMMANDS:  # the others' stand-ins: a typo's "did you mean" then knows every command
            self.get_command(ctx, name)
        return super().resolve_command(ctx, args)

    def get_command(self, ctx, name: str) -> TyperCommand | None:
        if name in LAZY_COMMANDS and name not in self.commands:  # listed, not run: its help text stands in
            self.commands[name] = TyperCommand(name, help=inspect.getdoc(LAZY_COMMANDS[name][1]))
        return super().get_command(ctx, name)

    def list_commands(self, ctx) -> list[str]:
        rank = {name: i for i, name in enumerate(HELP_ORDER)}
        names = set(super().list_commands(ctx)) | set(LAZY_COMMANDS)
        return sorted(names, key=lambda name: rank.get(name, len(rank)))

    def _made(self, name: str) -> bool:
        """Whether the lazy command `name` is made (not its stand-in)."""
        return self.commands.get(name) is not None and self.commands[name].callback is not None


app = typer.Typer(
    name="trajlake",
    help="Trajectory lake and trainer for RL on LLM agents.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    cls=_Commands,
)
for group in (collect, rewards, store, view, data, model):
    group.register(app)


@app.callback()
def _global(
    lake: Optional[str] = typer.Option(
        None, "--lake", help="Lake URI: a folder, sqlite:FILE or postgres:CONNINFO (default: $TRAJLAKE_LAKE or ./lake)"
    ),
    fmt: display.TableFormat = typer.Option(
        "table", "--format", help="How tables print: table (a terminal's width; elsewhere, e.g. a log file, as wide "
        "as its values), plain (columns aligned with spaces), markdown or csv."
    ),
    debug: bool = typer.Option(False, "--debug", help="Show tracebacks on errors, and the third-party warnings and "
                               "messages trajlake silences."),
) -> None:
    State.lake_uri = lake
    State.debug = debug
    display.set_table_format(fmt)
    quiet.set_debug(debug)


#: what DuckDB raises (a bare RuntimeError) when SIGINT interrupts a query it is running: a Ctrl-C, not a bug
DUCKDB_INTERRUPTED = "Query interrupted"


def main(argv: list[str] | None = None) -> int:
    """Entry point: run the CLI, turning errors into one line and a non-zero exit."""
    command = typer.main.get_command(app)
    args = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in args
    try:
        # without standalone mode click returns a command's typer.Exit(code) as the code instead of raising it
        code = command.main(args=args, prog_name="trajlake", standalone_mode=False)
        if isinstance(code, int) and code:
            return code
    except typer.Exit as e:
        return e.exit_code
    except typer.Abort:
        print("aborted", file=sys.stderr)
        return 130
    except typer.TyperException as e:  # usage errors: one line naming the problem and where the help is
        where = getattr(getattr(e, "ctx", None), "command_path", None) or "trajlake"
        message = e.format_message() if hasattr(e, "format_message") else str(e)
        if message.strip():  # no message: the help was shown (no command given)
            print(f"error: {one_line(message)} (see: {where} --help)", file=sys.stderr)
        return getattr(e, "exit_code", 2)
    except (TrajlakeError, OSError, ValueError, KeyError) as e:
        if debug:
            raise
        msg = e.args[0] if isinstance(e, KeyError) and e.args else str(e)
        if isinstance(e, OSError) and e.strerror and e.filename is not None:  # not "[Errno 20] ...: 'path'"
            msg = f"{e.filename}: {e.strerror}"
        elif isinstance(e, UnicodeDecodeError):  # a binary file where text was expected
            msg = f"a file given is not UTF-8 text ({e.reason} at byte {e.start})"
        print(f"error: {one_line(msg)}", file=sys.stderr)
        return 1
    except Exception as e:  # a bug, never a traceback: one line that says so and how to see the traceback
        if debug:
            raise
        if isinstance(e, RuntimeError) and str(e) == DUCKDB_INTERRUPTED:  # Ctrl-C while DuckDB ran a query
            print("aborted", file=sys.stderr)
            return 130
        print(f"error: internal error ({type(e).__name__}: {one_line(str(e))[:300]}); please report it, with "
              "the traceback --debug shows", file=sys.stderr)
        return 1
    finally:  # --format and --debug hold for this command only (main may be called again in the process)
        display.set_table_format(display.TableFormat.table)
        quiet.set_debug(False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
