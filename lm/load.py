"""Loading a local model and its tokenizer: the one way the sampler (collect/policies/hf.py), the trainer
(train/engine.py), the importers and the benchmarks read a checkpoint. Never reaches a model hub."""

from __future__ import annotations

from os import PathLike
from pathlib import Path
from typing import TYPE_CHECKING

from trajlake.core.errors import TrajlakeError

if TYPE_CHECKING:
    import torch


def load_model(path: str | PathLike, *, device: str = "cpu", dtype: torch.dtype | None = None,
               lm_head: bool = True):
    """The causal LM saved (save_pretrained) in the folder `path`, on `device`, in `dtype` (default float32),
    in eval mode. `lm_head` False: the transformer body alone (AutoModel: hidden states, no logits), e.g.
    under a value head. (torch is imported here, not with the module: commands that only read a tokenizer
    start faster.)"""
    import torch
    from transformers import AutoModel, AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # our own progress bars say what is happening
    path = Path(path)
    if not (path / "config.json").is_file():
        raise TrajlakeError(f"no model at {path}: expected a folder saved with save_pretrained (config.json)")
    cls = AutoModelForCausalLM if lm_head else AutoModel
    model = cls.from_pretrained(path, local_files_only=True, dtype=dtype or torch.float32).to(device)
    model.eval()
    return model


def tokenizer_folder(path: str | PathLike) -> Path:
    """The folder `path` names, checked to exist (nothing is loaded: commands check every input first)."""
    folder = Path(str(path)).expanduser()
    if not folder.is_dir():
        raise TrajlakeError(f"tokenizer path {path}: no such folder (give a model folder saved with save_pretrained, "
                            "e.g. from `trajlake model tiny --out DIR`)")
    return folder


def load_tokenizer(path: str | PathLike):
    """The tokenizer saved in the folder `path` (a model folder)."""
    name = str(path)
    folder = tokenizer_folder(path)
    try:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    except Exception as e:  # transformers raises many kinds (OSError, ValueError, JSON errors...)
        text = str(e).strip()
        raise TrajlakeError(f"cannot load tokenizer from {name}: "
                            f"{text.splitlines()[0] if text else type(e).__name__}") from None
