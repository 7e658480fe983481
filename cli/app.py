"""The `trajlake` command line: `trajlake [--lake URI] COMMAND`.

Each stage registers its commands here; the work itself lives in the stage packages. Errors print one
readable line and exit non-zero; `--debug` shows the traceback instead.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Optional

import typer

from trajlake.cli.common import (
    PATH,
    State,
    check_count,
    check_finite,
    check_text,
    one_line,
    open_lake,
    path_arg,
)
from trajlake.cli.data import export, import_app, lease_app, model_app, view
from trajlake.cli.options import rollout_options
from trajlake.collect.config import CollectConfig, check_url
from trajlake.core import display
from trajlake.core.errors import TrajlakeError
from trajlake.core.ids import check_id
from trajlake.evaluate.run import EvalConfig
from trajlake.store.outputs import check_output_path

#: the most episodes `rewards diff --top` lists (its LIMIT; DuckDB refused a negative or a non-BIGINT one only
#: after both specs' scores were stored)
MAX_TOP = 100_000

app = typer.Typer(
    name="trajlake",
    help="Trajectory lake and trainer for RL on LLM agents.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
rewards_app = typer.Typer(help="Score stored episodes with a reward spec (replay), or compare two specs.")
app.add_typer(import_app, name="import")
app.add_typer(rewards_app, name="rewards")
app.add_typer(model_app, name="model")
app.add_typer(lease_app, name="lease")


@app.callback()
def _global(
    lake: Optional[str] = typer.Option(
        None, "--lake", help="Lake URI: a folder, sqlite:FILE or postgres:CONNINFO [default: $TRAJLAKE_LAKE or ./lake]"
    ),
    debug: bool = typer.Option(False, "--debug", help="Show tracebacks on errors."),
) -> None:
    State.lake_uri = lake
    State.debug = debug


@app.command(context_settings={"ignore_unknown_options": True})  # SQL may start with a `-- comment`
def sql(
    query: Optional[str] = typer.Argument(None, help="SQL over the tables; none opens an interactive shell."),
    file: Optional[Path] = typer.Option(None, "--file", "-F", help="Read the SQL from this file (docs/queries/).",
                                        parser=path_arg, metavar=PATH),
    snapshot: Optional[int] = typer.Option(None, "--snapshot", "-s", help="Read the lake as of this snapshot."),
    fmt: display.Format = typer.Option("table", "--format", "-f", help="Output format."),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="Write to this file instead of stdout.",
                                       parser=path_arg, metavar=PATH),
) -> None:
    """Run read-only SQL on the lake (tables: tasks, runs, policies, episodes, turns, reward_specs, ...): one
    statement at a time; anything that would write (DDL, DML, COPY, ATTACH, SET, CALL...) is refused."""
    if file is not None:
        if query is not None:
            raise TrajlakeError("give the SQL either as an argument or with --file, not both")
        try:
            query = file.read_text()
        except OSError as e:
            raise TrajlakeError(f"cannot read SQL file {file}: {e.strerror}") from None
        except UnicodeDecodeError:  # a binary file (the lake's catalog, say) named by mistake
            raise TrajlakeError(f"cannot read SQL file {file}: not UTF-8 text") from None
    with open_lake(read_only=True) as lake:
        if query is None:
            display.shell(lake, snapshot=snapshot)
            return
        if out is not None:
            check_output_path(lake.catalog, out, "sql --out")
        display.emit(lake.query(query, snapshot=snapshot), fmt, out)


@app.command()
def snapshots() -> None:
    """List the lake's snapshots: id, time, stage, message, run id."""
    with open_lake(read_only=True) as lake:
        display.emit(lake.snapshots().drop("changes"), display.Format.table, None, max_rows=10_000)


@app.command()
def tables() -> None:
    """List the tables with their row counts."""
    from trajlake.schemas import TABLES

    with open_lake(read_only=True) as lake:
        counts = " UNION ALL ".join(f"SELECT '{t}' AS table_name, count(*) AS rows FROM {t}" for t in TABLES)
        display.emit(lake.query(counts), display.Format.table, None)


@app.command()
def maintain(
    expire_older_than: Optional[str] = typer.Option(
        None, "--expire-older-than", help="Expire snapshots older than this (e.g. 30d, 12h); none: keep all."
    ),
    grace: str = typer.Option("1h", "--grace", help="Never delete files younger than this (live writers)."),
) -> None:
    """Flush inlined rows, merge small files, expire old snapshots, delete unused files."""
    # `is not None`: an empty --expire-older-than (an unset variable) is a bad duration, not "keep all"
    expire = display.parse_duration(expire_older_than) if expire_older_than is not None else None
    grace_td = display.parse_duration(grace)  # both parsed before the lake is opened
    with open_lake() as lake:
        done = lake.maintain(expire_older_than=expire, grace=grace_td)
    display.console.print(", ".join(f"{k}: {v}" for k, v in done.items()))


@app.command()
@rollout_options(CollectConfig, required=("env",))
def collect(
    policy: str = typer.Option(..., "--policy", help="hf:PATH, vllm:PATH, openai:URL#MODEL, scripted:ENV, policy:ID"),
    tasks: int = typer.Option(32, "--tasks", help="How many tasks of the split."),
    task_offset: int = typer.Option(0, "--task-offset", help="Skip this many tasks of the split first."),
    samples: int = typer.Option(1, "--samples", help="Samples per task (a GRPO group)."),
    run_id: Optional[str] = typer.Option(None, "--run-id", help="Resume this run, or name a new one."),
    workers: int = typer.Option(0, "--workers", help="Ray actors stepping envs (0: in-process)."),
    tokenizer: Optional[str] = typer.Option(None, "--tokenizer", help="Tokenizer for text policies."),
    seed: int = typer.Option(0, "--seed"),
    env_variant: Optional[str] = typer.Option(
        None, "--env-variant", help="With --env agentgym: the environment NAME [default: told by the server]."),
    rollout: Optional[dict] = None,
) -> None:
    """Play episodes with a policy and store them, token for token. The same --run-id resumes a run (with the
    settings it was started with), retrying the episodes that ended in an env error; a run whose every episode
    ended in one is marked failed and exits 1."""
    from trajlake.collect.envs.agentgym_client import resolve_env_name
    from trajlake.collect.policies import resolve_policy_spec
    from trajlake.collect.rollout import collect as run_collect
    from trajlake.collect.summary import errors_line, print_summary

    # the user's run id is checked, never replaced: an empty one was silently swapped for a generated id
    check_id(run_id, "--run-id")
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


@app.command()
def envs() -> None:
    """List the registered environments."""
    import polars as pl

    from trajlake.collect.envs import env_info

    def splits(ranges: dict, remote: bool) -> str:
        if not ranges:
            return "listed by its server" if remote else "seeded"
        return ", ".join(f"{s} {a}-{b - 1}" if b is not None else f"{s} {a}+" for s, (a, b) in ranges.items())

    rows = [{"name": r["name"], "difficulties": ",".join(map(str, r["difficulties"])),
             "splits": splits(r["split_ranges"], r["remote"]), "actions": r["actions"], "description": r["description"]}
            for r in env_info()]
    display.emit(pl.DataFrame(rows), display.Format.table, None)


@app.command("serve-env")
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


@rewards_app.callback(invoke_without_command=True)
def rewards(
    ctx: typer.Context,
    spec: Optional[Path] = typer.Option(None, "--spec", help="Reward spec TOML [default: the built-in default].",
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
        display.emit(lake.query(
            "SELECT count(*) AS episodes, round(avg(total), 4) AS mean_total, round(min(total), 4) AS min, "
            "round(max(total), 4) AS max FROM episode_rewards WHERE spec_id = ?", [loaded.spec_id]),
            display.Format.table, None)


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
    display.emit(changes, display.Format.table, None)


@app.command()
def train(
    config: Optional[Path] = typer.Option(None, "--config", help="Train config TOML (see train/configs/).",
                                          parser=path_arg, metavar=PATH),
    algo: Optional[str] = typer.Option(None, "--algo", help="Override the config's algo: grpo, ppo or sft."),
    run_id: Optional[str] = typer.Option(None, "--run-id", help="Override the run id (the same id resumes)."),
    model: Optional[str] = typer.Option(None, "--model", help="Override the starting model: DIR, policy:ID, run:ID."),
    iterations: Optional[int] = typer.Option(None, "--iterations", help="Override the config's iterations."),
    env_url: Optional[str] = typer.Option(None, "--env-url", help="Override the AgentGym server URL of the env."),
    reward_spec: Optional[str] = typer.Option(None, "--reward-spec", help="Override the config's reward spec TOML."),
    train_filter: Optional[str] = typer.Option(
        None, "--train-filter", help="Train on the stored episodes this SQL over episodes selects, not fresh rollouts "
        "(with old_logprobs = \"behaviour\" or is_cap in the config)."),
    train_snapshot: Optional[int] = typer.Option(
        None, "--train-snapshot", help="The snapshot --train-filter reads (its episodes already scored by the spec)."),
    report_to: Optional[list[str]] = typer.Option(
        None, "--report-to", help="Override the config's trackers (repeat): tensorboard, wandb."),
    replay: Optional[str] = typer.Option(
        None, "--replay", help="Recompute a step of this stored GRPO/PPO run (with --step) and compare its weights "
        "with the stored checkpoint; trains nothing, writes nothing."),
    step: Optional[int] = typer.Option(None, "--step", help="The step --replay recomputes (from 1)."),
    atol: float = typer.Option(0.0, "--atol", help="With --replay: the largest weight difference accepted as equal "
                               "(0: bit for bit)."),
) -> None:
    """Train from the store: SFT warm start, or GRPO/PPO iterations that collect, score and update (or, with
    --train-filter, train on stored rollouts). With --replay RUN --step N: recompute step N of a run and check
    it against its checkpoint (exit status 1 when they differ by more than --atol)."""
    from trajlake.train.config import load_config
    from trajlake.train.loop import run

    if replay is not None or step is not None:
        others = (("--config", config), ("--algo", algo), ("--run-id", run_id), ("--model", model),
                  ("--iterations", iterations), ("--env-url", env_url), ("--reward-spec", reward_spec),
                  ("--train-filter", train_filter), ("--train-snapshot", train_snapshot),
                  ("--report-to", report_to or None))
        given = [n for n, v in others if v is not None]
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
    cfg = load_config(config, algo=algo, run_id=run_id, model=model, iterations=iterations, env_url=env_url,
                      reward_spec=reward_spec, train_filter=train_filter, train_snapshot=train_snapshot,
                      report_to=report_to or None)
    result = run(cfg, State.lake_uri)
    display.console.print(f"run {result.run_id}: step {result.step}, policy {result.policy_id}")


@app.command()
@rollout_options(EvalConfig, required=("env",))
def evaluate(
    policy: list[str] = typer.Option(..., "--policy", help="Policy spec to evaluate; repeat to compare several."),
    tasks: int = typer.Option(50, "--tasks"),
    samples: int = typer.Option(1, "--samples", help="Samples per task (pass@k needs k <= samples)."),
    greedy: bool = typer.Option(False, "--greedy", help="Greedy decoding (needs --samples 1)."),
    tokenizer: Optional[str] = typer.Option(None, "--tokenizer", help="Tokenizer for text policies."),
    spec: Optional[Path] = typer.Option(None, "--spec", help="Reward spec for the reward columns.",
                                        parser=path_arg, metavar=PATH),
    k: list[int] = typer.Option([1], "--k", help="pass@k values (repeatable); --samples is always added."),
    seed: int = typer.Option(0, "--seed"),
    rollout: Optional[dict] = None,
) -> None:
    """Play held-out tasks with each policy, store them (run kind eval) and report success, pass@k, reward,
    turns, format errors and tokens per episode, per env and difficulty, with 95% intervals. Play them as the
    policy was trained: the same --template and --system-prompt."""
    import polars as pl

    from trajlake.collect.envs.agentgym_client import resolve_env_name
    from trajlake.evaluate.metrics import format_summary
    from trajlake.evaluate.run import evaluate as run_eval

    check_url(rollout["env_url"], "--env-url")  # before resolve_env_name asks the URL's server for its name
    rollout["env"] = resolve_env_name(rollout["env"], rollout["env_url"])
    cfg = EvalConfig(**rollout, policies=tuple(policy), tasks=tasks, samples=samples, greedy=greedy,
                     tokenizer=tokenizer, spec=str(spec) if spec else None, ks=tuple(k), seed=seed)
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


@app.command()
def report(
    out: Path = typer.Option(Path("reports/latest"), "--out", help="Folder for index.html and the PNG plots.",
                             parser=path_arg, metavar=PATH),
    runs: Optional[list[str]] = typer.Option(None, "--runs", help="Only these train/eval runs (repeatable)."),
) -> None:
    """An HTML page with plots over the store (learning curves, KL and entropy, reward distributions, turns,
    policies side by side), each beside the query that made it."""
    from trajlake.evaluate.report import build_report

    with open_lake(read_only=True) as lake:
        check_output_path(lake.catalog, out, "report --out")
        index = build_report(lake, out, runs=runs or None)
    display.console.print(f"report: {index}")


# the data commands (cli_data.py), after the stages' own
app.command()(export)
app.command()(view)


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
        print(f"error: internal error ({type(e).__name__}: {one_line(str(e))[:300]}); please report it, with "
              "the traceback --debug shows", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
