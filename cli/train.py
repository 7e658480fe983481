"""The `trajlake train` command: train from a config file, with the overrides train/overrides.py declares
(the same ones `python -m trajlake.train` takes), or recompute a stored step with --replay RUN --step N.

Its click command is made by `command()` when `train` is asked for (cli/app.py): the override options come
from TrainConfig, whose module imports torch, a second of start-up every other command would pay."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from typer.core import TyperCommand

from trajlake.cli.common import PATH, State, check_finite, one_command, open_lake, path_arg, run_id_arg
from trajlake.cli.options import override_options
from trajlake.core import display
from trajlake.train.overrides import option_name


def train(
    config: Optional[Path] = typer.Option(None, "--config", help="Train config TOML (see train/configs/).",
                                          parser=path_arg, metavar=PATH),
    replay: Optional[str] = typer.Option(
        None, "--replay", help="Recompute a step of this stored GRPO/PPO run (with --step) and compare its weights "
        "with the stored checkpoint; trains nothing, writes nothing.", callback=run_id_arg),
    step: Optional[int] = typer.Option(None, "--step", help="The step --replay recomputes (from 1)."),
    atol: float = typer.Option(0.0, "--atol", help="With --replay: the largest weight difference accepted as equal "
                               "(0: bit for bit)."),
    overrides: Optional[dict] = None,
) -> None:
    """Train from the store: SFT warm start, or GRPO/PPO iterations that collect, score and update (or, with
    --train-filter, train on stored rollouts); each option under "Config overrides" replaces that field of the
    config. With --replay RUN --step N: recompute step N of a run and check it against its
    checkpoint (exit status 1 when they differ by more than --atol)."""
    if replay is not None or step is not None:
        given = (["--config"] if config is not None else []) + [option_name(f) for f in overrides]
        if replay is None or step is None or given:
            raise typer.BadParameter("--replay RUN_ID and --step N go together, and alone: the run's stored config "
                                     "says the rest" + (f" (drop {', '.join(given)})" if given else ""))
        from trajlake.train.reproduce import replay_step

        check_finite("--atol", atol)  # NaN would make every comparison false: a failed replay reported equal
        with open_lake() as lake:
            report = replay_step(lake, replay, step)
        display.console.print(report.describe(), markup=False, highlight=False, soft_wrap=True)
        if report.max_abs_diff > atol:
            raise typer.Exit(1)
        return
    if config is None:
        raise typer.BadParameter("Missing option '--config' (or --replay RUN_ID --step N)")
    refuse_a_held_run(config, overrides or {})
    from trajlake.train.config import load_config
    from trajlake.train.loop import run

    result = run(load_config(config, **overrides), State.lake_uri)
    display.console.print(f"run {result.run_id}: step {result.step}, policy {result.policy_id}")


def refuse_a_held_run(config: Path, overrides: dict) -> None:
    """The run's lease, checked before torch, DeepSpeed and the config's own checks load (seconds on a busy
    machine): a second `trajlake train` on a run id that a live process holds is refused at once. Anything this
    cannot read (a bad file, a bad id, a lake that does not exist yet) is left to load_config and the loop, which
    name it in their own words; the loop checks the lease again and takes it before its engines."""
    import tomllib

    from trajlake.core.errors import TrajlakeError
    from trajlake.core.ids import check_id
    from trajlake.core.text_files import read_text_file
    from trajlake.store.lease import RunLeasedError, check
    from trajlake.train.config import flatten

    try:
        stored = flatten(tomllib.loads(read_text_file(config, "train config")), str(config))
        run_id = check_id(overrides.get("run_id") or stored.get("run_id"))
        if run_id is None:
            return  # a new run id is generated: no other process can hold it
        with open_lake(read_only=True) as lake:
            check(lake, run_id)
    except RunLeasedError:
        raise
    except (OSError, UnicodeDecodeError, RecursionError, tomllib.TOMLDecodeError, TrajlakeError):
        return


def command() -> TyperCommand:
    """The `train` click command, its override options made from TrainConfig now."""
    return one_command("train", override_options()(train))
