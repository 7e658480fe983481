"""trajlake.lm: the one loader (load_model, load_tokenizer) that the sampler and the trainer share, and the one
shared-prefix detection (common_prefix) behind the sampler's prefix cache and the trainer's shared-prefix pass."""

from __future__ import annotations

import random

import pytest
import torch

from trajlake.core.errors import TrajlakeError
from trajlake.lm import load as L
from trajlake.lm.load import load_model, load_tokenizer
from trajlake.lm.prefix import common_prefix

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_load_model_and_tokenizer(tiny):
    model = load_model(tiny)
    assert not model.training and model.dtype == torch.float32 and hasattr(model, "lm_head")
    body = load_model(tiny, lm_head=False)  # the transformer alone, as under the critic's value head
    assert not hasattr(body, "lm_head")
    assert torch.equal(body.embed_tokens.weight, model.model.embed_tokens.weight)
    assert load_model(tiny, dtype=torch.bfloat16).dtype == torch.bfloat16
    tok = load_tokenizer(tiny)
    ids = tok("hello world")["input_ids"]
    assert tok.decode(ids) == "hello world"
    assert model(input_ids=torch.tensor([ids])).logits.shape == (1, len(ids), len(tok))


def test_load_errors_name_the_folder(tmp_path):
    with pytest.raises(TrajlakeError, match="no model at .*nothing.*config.json"):
        load_model(tmp_path / "nothing")
    with pytest.raises(TrajlakeError, match="tokenizer path .*nothing: no such folder"):
        load_tokenizer(tmp_path / "nothing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(TrajlakeError, match="cannot load tokenizer from .*empty"):
        load_tokenizer(tmp_path / "empty")


def test_sampler_and_trainer_share_the_loader(tiny):
    from trajlake.collect.policies import hf
    from trajlake.train import engine, forward

    # both take the loader and the prefix helpers from trajlake.lm (no copies of their own)
    assert hf.load_model is engine.load_model is L.load_model
    assert hf.load_tokenizer is engine.load_tokenizer is L.load_tokenizer
    assert hf.cache_unsupported is forward.cache_unsupported and hf.common_prefix is forward.common_prefix
    policy = hf.HFPolicy(tiny)
    assert not policy.model.training and policy.tokenizer.pad_token_id is not None


def test_common_prefix():
    assert common_prefix([]) == 0
    assert common_prefix(([], [1])) == 0
    assert common_prefix(([1, 2, 3],)) == 3
    assert common_prefix(([1, 2, 3], [1, 2, 3, 4])) == 3
    assert common_prefix(([1, 2, 3, 4], [1, 2, 3])) == 3
    assert common_prefix(([1, 2, 3, 4], [1, 2, 3, 5], [1, 2, 7])) == 2
    for cut in range(10):
        a = list(range(10))
        b = a[:cut] + [99] + a[cut + 1:]
        assert common_prefix((a, b)) == common_prefix((b, a)) == cut


def test_common_prefix_of_lists_and_tensors_agree():
    rng = random.Random(0)
    for _ in range(200):
        width, n = rng.randrange(1, 12), rng.randrange(1, 5)
        base = [rng.randrange(3) for _ in range(width)]
        rows = [[t if rng.random() < 0.9 else rng.randrange(3) for t in base] for _ in range(n)]
        expect = next((i for i in range(width) if len({r[i] for r in rows}) > 1), width)
        assert common_prefix(rows) == common_prefix(torch.tensor(rows)) == expect
    assert common_prefix(torch.zeros((0, 4), dtype=torch.long)) == 0
