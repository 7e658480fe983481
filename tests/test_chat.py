"""Chat token bookkeeping edge cases found by the rollout loop."""

import pytest

from trajlake.collect.chat import ChatRenderer, full_sequence
from trajlake.lm.build import build_tiny_model


@pytest.fixture(scope="module")
def renderer(tmp_path_factory):
    from transformers import AutoTokenizer

    path = build_tiny_model(tmp_path_factory.mktemp("tiny"))
    return ChatRenderer(AutoTokenizer.from_pretrained(path, local_files_only=True))


def test_template_end_of_turn_is_the_closing_token(renderer):
    assert renderer.template_end_of_turn == "<|im_end|>"


def test_reply_cut_after_another_special_token_keeps_it_as_content(renderer):
    tok = renderer.tokenizer
    eos_like = tok.convert_tokens_to_ids("<|endoftext|>")
    conv = renderer.conversation([{"role": "system", "content": "s"}])
    p0 = conv.observe("hi")
    reply = [300, 301, eos_like]  # cut at max tokens; the last token is special but does not end the turn
    content = conv.reply_ids(reply)
    assert content.endswith("<|endoftext|>")
    p1 = conv.observe("next")  # must not raise: the template's closing goes into the next prompt
    assert p1[0] == tok.convert_tokens_to_ids("<|im_end|>")
    ids, mask = full_sequence([(p0, reply), (p1, [])])
    assert tok.decode(ids).startswith(renderer.render(conv.messages[:2], generation_prompt=True))
    assert sum(mask) == len(reply)
