"""The `trajlake` commands that play envs: `collect` (store episodes for training), `evaluate` (held-out
episodes, with success, pass@k and intervals), `envs` (the registered envs) and `serve-env` (one of them over
AgentGym's HTTP protocol). Their rollout options come from RolloutConfig's fields (cli/options.py).

`collect` and `evaluate` are made by `collect_command()` and `evaluate_command()` when run (cli/app.py): their
dozens of options cost typer a twentieth of a second, which `trajlake sql` would pay too."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Optional

import typer
from typer.core import TyperCommand

from trajlake.cli.common import PATH, check_text, one_command, open_lake, path_arg, run_id_arg
from trajlake.core import display
from trajlake.core.errors import TrajlakeError

if TYPE_CHECKING:
    from trajlake.evaluate.config import EvalConfig


def collect(
    policy: str = typer.Option(..., "--policy", help="hf:PATH, vllm:PATH, openai:URL#MODEL, scripted:ENV, policy:ID"),
    tasks: int = typer.Option(32, "--tasks", help="How many tasks of the split."),
    task_offset: int = typer.Option(0, "--task-offset", help="Skip this many tasks of the split first."),
    samples: int = typer.Option(1, "--samples", help="Samples per task (a GRPO group)."),
    run_id: Optional[str] = typer.Option(None, "--run-id", help="Resume this run, or name a new one.",
                                         callback=run_id_arg),
    workers: int = typer.Option(0, "--workers", help="Ray actors stepping envs (0: in-process)."),
    tokenizer: Optional[str] = typer.Option(None, "--tokenizer", help="Tokenizer for text policies."),
    seed: int = typer.Option(0, "--seed"),
    env_variant: Optional[str] = typer.Option(
        None, "--env-variant", help="With --env agentgym: the environment NAME (default: told by the server)."),
    rollout: Optional[dict] = None,
) -> None:
    """Play episodes with a policy and store them, token for token. The same --run-id resumes a run (with the
    settings it was started with), retrying the episodes that ended in an env error; a run whose every episode
    ended in one is marked failed and exits 1."""
    from trajlake.collect.config import CollectConfig, check_url
    from trajlake.collect.envs.agentgym_client import resolve_env_name
    from trajlake.collect.policies import resolve_policy_spec
    from trajlake.collect.rollout import collect as run_collect
    from trajlake.collect.summary import errors_line, print_summary

    check_url(rollout["env_url"], "--env-url")  # before resolve_env_name asks the URL's server for its name
    check_text("--env-variant", env_variant)  # "" was taken for "not given" and the run played without it
    rollout["env"] = resolve_env_name(rollout["env"], rollout["env_url"], env_variant)
    config = CollectConfig(**rollout, policy=policy, tasks=tasks, task_offset=task_offset, samples=samples,
                           run_id=run_id, workers=workers, tokenizer=tokenizer, seed=seed)
    with open_lake() as lake:
        config = dataclasses.replace(config, policy=resolve_policy_spec(lake, policy))
        rid = run_collect(config, lake)  # a run whose every episode hit an env error raises (exit 1)
        print_summary(lake, rid)
        line = errors_line(lake, rid)
    if line:
        display.console.print(line, markup=False, highlight=False, soft_wrap=True)  # the last line: what to retry


def evaluate(
    ctx: typer.Context,
    policy: list[str] = typer.Option(..., "--policy", help="Policy spec to evaluate; repeat to compare several."),
    tasks: int = typer.Option(50, "--tasks"),
    samples: int = typer.Option(1, "--samples", help="Samples per task (pass@k needs k <= samples)."),
    greedy: bool = typer.Option(False, "--greedy", help="Greedy decoding (needs --samples 1)."),
    tokenizer: Optional[str] = typer.Option(None, "--tokenizer", help="Tokenizer for text policies."),
    spec: Optional[Path] = typer.Option(None, "--spec", help="Reward spec for the reward columns.",
                                        parser=path_arg, metavar=PATH),
    k: list[int] = typer.Option([1], "--k", help="pass@k values (repeatable); --samples is always added."),
    seed: int = typer.Option(0, "--seed"),
    temperatures: Optional[str] = typer.Option(
        None, "--temperatures", metavar="T1,T2,...",
        help="Choose the rollout temperature by measurement: evaluate the one --policy greedily and at each of "
        "these temperatures (at most 8, each > 0) on the same tasks of --split (val unless given), each a stored "
        "eval run, and print the table and the chosen temperature: the highest whose sampled success is not below "
        "the greedy success's 95% Wilson lower bound (none: the lowest). Not with --greedy or --temperature."),
    rollout: Optional[dict] = None,
) -> None:
    """Play held-out tasks with each policy, store them (run kind eval) and report success, pass@k, reward,
    turns, format errors and tokens per episode, per env and difficulty, with 95% intervals. Play them as the
    policy was trained: the same --template and --system-prompt. With --temperatures, sweep the rollout
    temperature of one policy instead (docs/evaluate.md: Choosing the rollout temperature)."""
    import polars as pl

    from trajlake.collect.config import check_url
    from trajlake.collect.envs.agentgym_client import resolve_env_name
    from trajlake.evaluate.config import EvalConfig
    from trajlake.evaluate.metrics import format_summary
    from trajlake.evaluate.run import evaluate as run_eval

    sweep = _sweep_temperatures(ctx, temperatures, policy, greedy, rollout) if temperatures is not None else None
    check_url(rollout["env_url"], "--env-url")  # before resolve_env_name asks the URL's server for its name
    rollout["env"] = resolve_env_name(rollout["env"], rollout["env_url"])
    cfg = EvalConfig(**rollout, policies=tuple(policy), tasks=tasks, samples=samples, greedy=greedy,
                     tokenizer=tokenizer, spec=str(spec) if spec else None, ks=tuple(k), seed=seed)
    if sweep is not None:
        _run_sweep(cfg, *sweep)
        return
    if cfg.split == "train":  # allowed (a sanity check of fitting), but its numbers must not pass for held-out ones
        print("warning: evaluating on the train split: the policy may have trained on these tasks, so these "
              "numbers are not held out (use --split test or val for a held-out evaluation)", file=sys.stderr)
    with open_lake() as lake:
        result = run_eval(cfg, lake)
    for p, rid in result.runs.items():
        display.console.print(f"{p}: eval run {rid}")
    table = format_summary(result.summary)
    label = pl.col("policy") + pl.when(pl.col("difficulty") == "all").then(pl.lit("")).otherwise(
        " (difficulty " + pl.col("difficulty") + ")")
    display.emit_vertical(table.with_columns(label.alias("policy")).drop("difficulty"), key="policy")
    for note in result.notes:  # the last lines: e.g. how many episodes ended in an env error, and how to retry
        display.console.print(note, markup=False, highlight=False, soft_wrap=True)


def _given(ctx: typer.Context, name: str) -> bool:
    """Whether the user gave option `name` (not merely its default): a sweep sets the temperature and defaults
    the split itself."""
    source = ctx.get_parameter_source(name)
    return source is not None and source.name != "DEFAULT"


def _sweep_temperatures(ctx: typer.Context, text: str, policy: list[str], greedy: bool,
                        rollout: dict) -> tuple[tuple[float, ...], str]:
    """The checked temperatures of `--temperatures` and the split the sweep plays, or the one-line refusal of a
    sweep asked for with options it cannot take (before anything is resolved or played)."""
    from trajlake.evaluate.temperature import parse_temperatures

    temps = parse_temperatures(text, "evaluate: --temperatures")
    clash = [(greedy, "--greedy (the sweep plays greedy as its baseline)"),
             (_given(ctx, "temperature"), "--temperature (the sweep sets each point's temperature)"),
             (len(policy) != 1, f"{len(policy)} policies (a sweep chooses the temperature of one --policy)")]
    for bad, what in clash:
        if bad:
            raise TrajlakeError(f"evaluate: --temperatures does not go with {what}")
    split = rollout["split"] if _given(ctx, "split") else "val"
    if split != "val":  # allowed, but a temperature tuned on these tasks makes their numbers no longer held out
        print(f"warning: choosing the temperature on the {split} split tunes it on tasks whose numbers you may "
              "report; use --split val", file=sys.stderr)
    return temps, split


def _run_sweep(cfg: EvalConfig, temps: tuple[float, ...], split: str) -> None:
    """Play (or read back) the sweep and print its table, its notes and the chosen temperature last."""
    from trajlake.evaluate.temperature import kept_temperatures, sweep_temperatures

    with open_lake() as lake:
        result = sweep_temperatures(lake, cfg, cfg.policies[0], temps, split=split)
    display.show(result.table)
    for note in result.notes:
        display.console.print(note, markup=False, highlight=False, soft_wrap=True)
    if result.chosen in set(kept_temperatures(result.points)):
        why = "the highest whose sampled success is within greedy's 95% interval"
    else:
        why = "none kept greedy's success within its 95% interval: the lowest swept"
    display.console.print(f"chosen temperature: {result.chosen} ({why})", markup=False, highlight=False,
                          soft_wrap=True)


def envs(
    env: Optional[str] = typer.Option(
        None, "--env", help="Show this env's splits instead: tasks, scheme and difficulty histogram per split."),
) -> None:
    """List the registered environments, or one env's splits (--env)."""
    import polars as pl

    from trajlake.collect.envs import env_info

    rows = env_info()
    if env is not None:
        check_text("--env", env)
        row = next((r for r in rows if r["name"] == env), None)
        if row is None:
            raise TrajlakeError(f"unknown env {env!r}; valid envs: {', '.join(r['name'] for r in rows)}")
        display.show(pl.DataFrame(_split_rows(row)))
        return
    table = [{"name": r["name"], "difficulties": ",".join(map(str, r["difficulties"])), "splits": _splits_text(r),
              "actions": r["actions"], "description": r["description"]} for r in rows]
    display.show(pl.DataFrame(table))


def _splits_text(row: dict) -> str:
    """An env's splits in one cell: "stratified-v1: test 100, val 100, train 344" for a server's data indices
    (a split without an end says so), "seeded" for the built-ins, "listed by its server" for trajlake's server."""
    if not row["split_sizes"]:
        return "listed by its server" if row["remote"] else "seeded"
    sizes = ", ".join(f"{s} {'no end' if n is None else n}" for s, n in row["split_sizes"].items())
    return f"{row['split_scheme']}: {sizes}"


def _split_rows(row: dict) -> list[dict]:
    """One row per split of `row`'s env: its tasks, its scheme and, where the env knows its tasks' difficulty
    (TextCraft's crafting depth), how many tasks of each difficulty it holds ("1: 23, 2: 54, ...")."""
    sizes = row["split_sizes"] or dict.fromkeys(row["splits"])
    seeded = "listed by its server" if row["remote"] else "seeded"
    return [{"split": s, "tasks": seeded if not row["split_sizes"] else ("no end" if n is None else str(n)),
             "scheme": row["split_scheme"] or seeded,
             "difficulty": ", ".join(f"{d}: {k}" for d, k in row["split_difficulty"].get(s, {}).items())}
            for s, n in sizes.items()]


def serve_env(
    env: str = typer.Option(..., "--env", help="Registered env to serve."),
    port: int = typer.Option(8000, "--port"),
    host: str = typer.Option("127.0.0.1", "--host", help="Bind address (loopback unless told otherwise)."),
    split: str = typer.Option("test", "--split", help="Split whose tasks data_idx indexes."),
    prefix: str = typer.Option("", "--prefix", help="Route prefix, e.g. maze for /maze/create."),
    shape: str = typer.Option(
        "trajlake", "--shape", help="Wire shape: trajlake (lists and sends whole tasks), or an AgentGym NAME to "
        "imitate that server's (for testing a client without it)."),
) -> None:
    """Serve a registered env over AgentGym's HTTP protocol."""
    from trajlake.collect.envs import make_env
    from trajlake.collect.envs.agentgym_presets import get_preset
    from trajlake.collect.envs.agentgym_server import run_server

    check_text("--host", host)  # "" binds every interface, not the loopback the help promises
    if prefix:  # the default "" is no prefix; a given one is a route segment, never a control character
        check_text("--prefix", prefix)
    make_env(env)  # an unknown name fails here with the list of envs
    run_server(env, host, port, split, prefix, preset=get_preset(shape))


def collect_command() -> TyperCommand:
    """The `collect` click command, its rollout options made from CollectConfig now."""
    from trajlake.cli.options import rollout_options
    from trajlake.collect.config import CollectConfig

    return one_command("collect", rollout_options(CollectConfig, required=("env",))(collect))


def evaluate_command() -> TyperCommand:
    """The `evaluate` click command, its rollout options made from EvalConfig now."""
    from trajlake.cli.options import rollout_options
    from trajlake.evaluate.config import EvalConfig

    return one_command("evaluate", rollout_options(EvalConfig, required=("env",))(evaluate))


def register(app: typer.Typer) -> None:
    app.command()(envs)
    app.command("serve-env")(serve_env)
