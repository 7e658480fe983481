"""Build a tiny but real causal LM (tokenizer + Llama weights) fully offline.

Tests and the demo need a model that goes through exactly the same code paths
as a production checkpoint (``AutoTokenizer`` / ``AutoModelForCausalLM``,
chat template, ``generate``) without ever touching a model hub. This module
trains a byte-level BPE tokenizer on a corpus it generates itself and pairs it
with a randomly initialised ~1M-parameter ``LlamaForCausalLM``.

The tokenizer does not depend on ``seed``: the corpus and the BPE trainer are
deterministic, so every build yields a byte-identical ``tokenizer.json`` and
models built with different seeds share a vocabulary. ``seed`` only drives
weight initialisation.
"""

from __future__ import annotations

import random
from pathlib import Path

BOS = PAD = UNK = "<|endoftext|>"
IM_START, IM_END = "<|im_start|>", "<|im_end|>"
SPECIAL_TOKENS = [BOS, IM_START, IM_END]

# ChatML. Every message renders to a self-contained chunk and nothing is emitted
# after the last message unless add_generation_prompt is set, so rendering a
# prefix of the messages gives a text prefix of rendering all of them; the
# trajectory code relies on that to locate assistant spans by string offsets.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

_WORD_TEXT = (
    "the a an and or not to of in on at by for with from into over under up down left right north south "
    "east west go move take drop open close look use craft make guess pick put find reach get give read "
    "door key wall room floor box chest table stone wood plank stick iron gold diamond pickaxe sword torch "
    "crafting recipe inventory item items number target higher lower correct wrong win lose game turn step "
    "agent player user assistant system environment observation action thought answer reward done true "
    "false null you are is was be have has can will should must need want think plan next then first last "
    "because so if else while this that there here it we they i my your our goal path maze grid cell row "
    "column position start end exit blocked free visited empty full count total score points left over "
    "please let me try again now good great sorry yes no ok invalid valid format tool call result error "
    "search query page click buy item price color size water fire earth air light dark red green blue "
    "apple banana bread cheese milk sugar salt shop store market cart order ship send receive return "
    "small large big tiny long short high low fast slow early late old new hot cold warm cool soft hard "
    "house garden forest river mountain city town road bridge tower castle cave island lake sea sky "
    "again always never sometimes often maybe perhaps almost already still just only also even very "
    "say tell ask know see hear feel walk run jump climb swim fly build break fix check verify solve "
    "question problem solution example test value list string object array function return print "
    "monday friday today tomorrow yesterday morning evening night hour minute second time date year "
    "one two three four five six seven eight nine ten hundred thousand first second third half double"
)
_WORDS = _WORD_TEXT.split()
_DIRS = ("north", "south", "east", "west", "up", "down", "left", "right")
_ITEMS = ("oak log", "oak planks", "stick", "crafting table", "wooden pickaxe", "stone", "iron ingot",
          "torch", "coal", "furnace", "chest", "bread", "wheat", "string", "bow")
_PUNCT = ".,;:!?'\"()[]{}<>-_=+*/\\|@#$%^&~`"


def _sentence(rng: random.Random, n: int) -> str:
    words = [rng.choice(_WORDS) for _ in range(n)]
    return " ".join(words).capitalize() + rng.choice(".!?")


def _corpus(n_lines: int = 6000) -> list[str]:
    """Deterministic agent-flavoured training text (fixed RNG, fixed order)."""
    rng = random.Random(1234)
    lines = [_PUNCT, "0123456789", " ".join(_WORDS), "".join(chr(c) for c in range(32, 127))]
    for i in range(n_lines):
        d, item = rng.choice(_DIRS), rng.choice(_ITEMS)
        x, y, k = rng.randrange(10), rng.randrange(10), rng.randrange(1, 100)
        kind = i % 9
        if kind == 0:
            lines.append(f"<think>go {d} to reach the {rng.choice(_WORDS)}</think><action>move {d}</action>")
        elif kind == 1:
            lines.append(f"Thought: {_sentence(rng, rng.randrange(4, 12))} Action: {rng.choice(_WORDS)}"
                         f"[{rng.choice(_WORDS)}]\nObservation: {_sentence(rng, rng.randrange(3, 9))}")
        elif kind == 2:
            walls = ", ".join(rng.sample(_DIRS[:4], rng.randrange(1, 4)))
            lines.append(f"You are at ({x}, {y}) in the maze. Walls to the {walls}. The exit is {d}.")
        elif kind == 3:
            lines.append(f"Crafting: craft {k % 4 + 1} {item} using {k % 3 + 1} {rng.choice(_ITEMS)}. "
                         f"Inventory: [{item}] ({k})")
        elif kind == 4:
            lines.append(f"I guess {k}. Feedback: the number is {rng.choice(['higher', 'lower'])} than {k}."
                         f" Guesses left: {x}")
        elif kind == 5:
            lines.append(f'{{"action": "move", "direction": "{d}", "steps": {k}, "done": '
                         f'{rng.choice(["true", "false"])}, "reward": {x}.{y}, "info": null}}')
        elif kind == 6:
            row = "".join(rng.choice("#..@G") for _ in range(8))
            lines.append(f"Row {y}: {row}\nGrid {x}x{y}, score={k}, step {i}")
        elif kind == 7:
            lines.append(f"{IM_START}user\n{_sentence(rng, 8)}{IM_END}\n{IM_START}assistant\n"
                         f"{_sentence(rng, 6)}{IM_END}\n")
        else:
            lines.append(_sentence(rng, rng.randrange(5, 20)) + f" {k}, {x * 1000 + y}; {rng.choice(_PUNCT)}")
    return lines


def _train_bpe(vocab_size: int):
    """Train the raw byte-level BPE ``tokenizers.Tokenizer`` on the built-in corpus.

    Deterministic: the corpus is a fixed list in a fixed order, and the result
    does not depend on per-process hash seeds or on TOKENIZERS_PARALLELISM; the
    tests check this by training in separate processes and comparing ``to_str()``.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token=None))  # byte-level: every byte is in the alphabet, no unk needed
    # add_prefix_space=False so decode(encode(x)) == x exactly (no invented leading space).
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,  # ids 0, 1, 2 in this order
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(), trainer=trainer)
    return tok


def _train_tokenizer(vocab_size: int):
    """The BPE tokenizer wrapped as a transformers fast tokenizer with the ChatML template."""
    from transformers import PreTrainedTokenizerFast

    fast = PreTrainedTokenizerFast(
        tokenizer_object=_train_bpe(vocab_size),
        bos_token=BOS, pad_token=PAD, unk_token=UNK, eos_token=IM_END,
        additional_special_tokens=[IM_START],
        clean_up_tokenization_spaces=False,  # keep round-trips exact
        model_max_length=2048,
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def build_tiny_model(
    out: str | Path,
    *,
    seed: int = 0,
    vocab_size: int = 2048,
    hidden_size: int = 128,
    num_layers: int = 4,
) -> Path:
    """Build a tiny random-weight Llama + BPE tokenizer and ``save_pretrained`` it into ``out``.

    ``out`` is created if missing (existing files in it are overwritten); it must
    not be an existing regular file. The result loads with
    ``AutoTokenizer.from_pretrained(out)`` / ``AutoModelForCausalLM.from_pretrained(out)``
    offline. Same ``seed`` -> identical tokenizer.json and weights; the tokenizer
    is the same for every seed. ``vocab_size`` is an upper bound: the real size
    is whatever BPE reaches on the corpus. Returns ``Path(out)``.
    """
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise FileExistsError(f"cannot build model into {str(out)!r}: it exists and is not a directory")
    if hidden_size % 4:
        raise ValueError(f"hidden_size must be divisible by the 4 attention heads, got {hidden_size}")

    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM
    from transformers.utils import logging as hf_logging

    tokenizer = _train_tokenizer(vocab_size)
    bos_id, eos_id, pad_id = (tokenizer.convert_tokens_to_ids(t) for t in (BOS, IM_END, PAD))
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 5 // 2,  # 320 for hidden 128 -> ~1M parameters in total
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        bos_token_id=bos_id,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
    )
    # fork_rng: seed init deterministically without clobbering the caller's global RNG state.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config).to(torch.float32)
    model.generation_config = GenerationConfig(bos_token_id=bos_id, eos_token_id=eos_id, pad_token_id=pad_id)
    model.eval()

    out.mkdir(parents=True, exist_ok=True)
    # A one-shard "Writing model shards" tqdm bar is noise in tests and the CLI; restore the user's setting.
    bars_were_on = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        model.save_pretrained(out)  # safetensors (model.safetensors) is the default format
    finally:
        if bars_were_on:
            hf_logging.enable_progress_bar()
    tokenizer.save_pretrained(out)
    return out


def model_summary(path: str | Path) -> dict:
    """Shape facts about a saved model, read from config + safetensors headers (no weights loaded).

    ``params`` counts unique stored tensors, so tied embeddings are counted once.
    """
    import json
    import math

    from safetensors import safe_open

    path = Path(path)
    cfg = json.loads((path / "config.json").read_text())
    params = 0
    for f in sorted(path.glob("*.safetensors")):
        with safe_open(str(f), framework="pt") as st:
            names = st.keys()  # safe_open handles are not iterable themselves
            params += sum(math.prod(st.get_slice(name).get_shape()) for name in names)
    return {
        "path": str(path),
        "model_type": cfg.get("model_type"),
        "params": params,
        "vocab_size": cfg.get("vocab_size"),
        "hidden_size": cfg.get("hidden_size"),
        "num_layers": cfg.get("num_hidden_layers"),
        "num_heads": cfg.get("num_attention_heads"),
        "intermediate_size": cfg.get("intermediate_size"),
        "max_position_embeddings": cfg.get("max_position_embeddings"),
        "tie_word_embeddings": cfg.get("tie_word_embeddings"),
    }
