"""The `trajlake` commands that show what is in the lake: `view` (the trajectory viewer, served or exported)
and `report` (an HTML page of plots, each beside its query)."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Optional

import typer

from trajlake.cli.common import PATH, check_output, check_port, open_lake, path_arg, run_id_arg
from trajlake.core import display


def view(
    port: int = typer.Option(8765, "--port", help="Port on 127.0.0.1 (0: any free one)."),
    snapshot: Optional[int] = typer.Option(None, "--snapshot", "-s", help="The snapshot to show (default: now)."),
    out: Optional[Path] = typer.Option(None, "--out", help="Write the pages to this folder instead of serving.",
                                       parser=path_arg, metavar=PATH),
    spec: Optional[str] = typer.Option(None, "--spec", help="With --out: the spec id whose rewards the pages "
                                       "show (default: the last scored)."),
    max_episodes: Optional[int] = typer.Option(None, "--max-episodes", min=0, help="With --out: write the pages "
                                               "of the first N episodes by id only (default: every episode)."),
) -> None:
    """The trajectory viewer: runs, their episodes (filters, sorting), and each episode turn by turn with its
    reply tokens shaded by the reward allocated to them. Served on 127.0.0.1 until Ctrl-C, or exported."""
    from trajlake.view.server import Viewer, export_site

    ctrl_c_stops()
    check_port(port)  # outside 0..65535 the socket layer raised OverflowError
    with open_lake(read_only=True) as lake:
        if out is not None:
            check_output(lake, out, "view --out")
            n = export_site(lake, out, snapshot=snapshot, spec=spec, max_episodes=max_episodes)
            display.console.print(f"viewer pages for {n} episodes in {out} (open {out / 'index.html'})")
            return
        if spec is not None or max_episodes is not None:
            raise typer.BadParameter("--spec and --max-episodes go with --out (served pages choose the spec on the "
                                     "page)")
        viewer = Viewer(lake, snapshot=snapshot, port=port)
        try:  # Ctrl-C is how it ends, from the moment it says so
            display.console.print(f"trajlake viewer at {viewer.url} (snapshot {viewer.snapshot}); Ctrl-C stops it")
            viewer.serve()
        except KeyboardInterrupt:
            pass
        finally:
            viewer.close()


def ctrl_c_stops() -> None:
    """Ctrl-C (SIGINT) raises KeyboardInterrupt here whatever the process inherited: a command started in the
    background by a non-interactive shell (`trajlake view &` in a script) inherits SIGINT ignored, Python keeps
    that, and a served viewer then ignored Ctrl-C and `kill -INT` and served on. The viewer is interactive: the
    user's interrupt stops it."""
    signal.signal(signal.SIGINT, signal.default_int_handler)


def report(
    out: Path = typer.Option(Path("reports/latest"), "--out", help="Folder for index.html and the PNG plots.",
                             parser=path_arg, metavar=PATH),
    runs: Optional[list[str]] = typer.Option(None, "--runs", help="Only these train/eval runs (repeatable).",
                                             callback=run_id_arg),
) -> None:
    """An HTML page with plots over the store (learning curves, KL and entropy, reward distributions, turns,
    policies side by side), each beside the query that made it."""
    from trajlake.view.report import build_report

    with open_lake(read_only=True) as lake:
        check_output(lake, out, "report --out")
        index = build_report(lake, out, runs=runs or None)
    display.console.print(f"report: {index}")


def register(app: typer.Typer) -> None:
    app.command()(view)
    app.command()(report)
