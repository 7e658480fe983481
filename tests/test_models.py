"""Tests for the offline tiny-model builder (trajlake.lm.build)."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from trajlake.lm.build import build_tiny_model, model_summary

MESSAGES = [
    {"role": "system", "content": "You play a maze game."},
    {"role": "user", "content": "You are at (1, 2). Walls to the north."},
    {"role": "assistant", "content": "<think>go east to reach the door</think><action>move east</action>"},
    {"role": "user", "content": "You are at (2, 2). The exit is south."},
]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model", seed=0)


@pytest.fixture(scope="module")
def tok(built):
    return AutoTokenizer.from_pretrained(built)


@pytest.fixture(scope="module")
def model(built):
    return AutoModelForCausalLM.from_pretrained(built)


def test_saved_files_and_summary(built, model, tok):
    for name in ("model.safetensors", "config.json", "tokenizer.json", "generation_config.json"):
        assert (built / name).is_file(), name
    s = model_summary(built)
    n_params = sum(p.numel() for p in model.parameters())  # parameters() dedups the tied embedding
    assert s["params"] == n_params
    assert 500_000 <= n_params <= 2_000_000
    assert s["vocab_size"] == len(tok) == model.config.vocab_size
    assert (s["hidden_size"], s["num_layers"]) == (128, 4)
    assert model.config.tie_word_embeddings
    assert model.get_input_embeddings().weight.data_ptr() == model.get_output_embeddings().weight.data_ptr()


def test_special_tokens_and_generation_config(tok, model):
    assert tok.eos_token == "<|im_end|>"
    assert tok.pad_token == tok.bos_token == "<|endoftext|>"
    assert model.generation_config.eos_token_id == tok.eos_token_id
    assert model.generation_config.pad_token_id == tok.pad_token_id
    for t in ("<|endoftext|>", "<|im_start|>", "<|im_end|>"):
        assert len(tok.encode(t, add_special_tokens=False)) == 1, t


def test_chat_template_renders_chatml(tok):
    text = tok.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    expected = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in MESSAGES)
    assert text == expected + "<|im_start|>assistant\n"
    assert tok.apply_chat_template(MESSAGES, tokenize=False) == expected


def test_chat_template_is_prefix_stable(tok):
    full = tok.apply_chat_template(MESSAGES, tokenize=False)
    for k in range(1, len(MESSAGES) + 1):  # transformers refuses an empty conversation
        prefix = tok.apply_chat_template(MESSAGES[:k], tokenize=False)
        assert full.startswith(prefix)
        # The generation prompt of k messages is a prefix of the rendering that adds an assistant turn.
        gen = tok.apply_chat_template(MESSAGES[:k], tokenize=False, add_generation_prompt=True)
        with_reply = tok.apply_chat_template(
            MESSAGES[:k] + [{"role": "assistant", "content": "Action: move north"}], tokenize=False
        )
        assert with_reply.startswith(gen)
        assert with_reply[len(gen):] == "Action: move north<|im_end|>\n"


@pytest.mark.parametrize(
    "text",
    [
        "Thought: I should go north. Action: move[north]",
        '{"action": "craft", "item": "oak planks", "count": 4, "ok": true}',
        "  leading spaces, tabs\tand\nnewlines\n\n  ~!@#$%^&*()_+`-=[]\\{}|;':\",./<>?",
        "zzqx unseen w0rds 1234567890 Z",
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nhello<|im_end|>\n<|endoftext|>",
        "",
    ],
)
def test_tokenizer_round_trips(tok, text):
    ids = tok.encode(text, add_special_tokens=False)
    assert tok.decode(ids) == text
    assert tok.unk_token_id not in ids or "<|endoftext|>" in text  # byte-level: nothing is unknown


def test_generate_samples_new_tokens(tok, model):
    ids = tok.apply_chat_template(MESSAGES, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    torch.manual_seed(0)
    out = model.generate(**ids, do_sample=True, max_new_tokens=8, min_new_tokens=8)
    n_prompt = ids["input_ids"].shape[1]
    assert out.shape == (1, n_prompt + 8)
    assert torch.equal(out[0, :n_prompt], ids["input_ids"][0])
    assert all(0 <= i < len(tok) for i in out[0, n_prompt:].tolist())


def test_same_seed_identical_other_seed_different(built, tmp_path):
    again = build_tiny_model(tmp_path / "again", seed=0)
    other = build_tiny_model(tmp_path / "other", seed=1)
    assert (again / "tokenizer.json").read_bytes() == (built / "tokenizer.json").read_bytes()
    assert (other / "tokenizer.json").read_bytes() == (built / "tokenizer.json").read_bytes()
    w0, w0b, w1 = (load_file(p / "model.safetensors") for p in (built, again, other))
    assert w0.keys() == w0b.keys() == w1.keys()
    assert all(torch.equal(w0[k], w0b[k]) for k in w0)
    assert not torch.equal(w0["model.embed_tokens.weight"], w1["model.embed_tokens.weight"])


def test_build_does_not_touch_global_rng(tmp_path):
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    build_tiny_model(tmp_path / "m", seed=7)
    assert torch.equal(torch.rand(3), expected)


def test_bpe_training_is_deterministic_across_processes():
    # Rust hash maps are seeded per process, so ordering bugs would only show across processes.
    code = (
        "import hashlib; from trajlake.lm.build import _train_bpe; "
        "print(hashlib.sha256(_train_bpe(2048).to_str().encode()).hexdigest())"
    )
    digests = set()
    for parallel in ("true", "false", "true"):
        env = {**os.environ, "TOKENIZERS_PARALLELISM": parallel}
        res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
        digests.add(res.stdout.strip())
    from trajlake.lm.build import _train_bpe

    digests.add(hashlib.sha256(_train_bpe(2048).to_str().encode()).hexdigest())
    assert len(digests) == 1


def test_build_into_regular_file_fails(tmp_path):
    target = tmp_path / "not_a_dir"
    target.write_text("occupied")
    with pytest.raises(FileExistsError, match="not_a_dir"):
        build_tiny_model(target)
    assert target.read_text() == "occupied"
