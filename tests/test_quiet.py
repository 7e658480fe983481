"""Third-party chatter (core/quiet.py): DeepSpeed's build line dropped where its process group starts, the
transformers cache deprecations avoided by passing and reading the cache by its current name; anything
else still shows, and `--debug` lets the silenced output through."""

from __future__ import annotations

import warnings

import pytest
import torch

from trajlake.core import quiet

BUILT = "DeepSpeed deepspeed.ops.comm.deepspeed_shm_comm_op built successfully"


@pytest.fixture(autouse=True)
def _not_debug(monkeypatch):
    monkeypatch.delenv("TRAJLAKE_DEBUG", raising=False)
    yield
    quiet.set_debug(False)


def _chatty():
    print("a line of the command's own")
    print(BUILT)
    print("another line, an error from the library")


def test_the_known_line_is_dropped_and_every_other_kept(capsys):
    with quiet.dropping_lines(quiet.DEEPSPEED_BUILT):
        _chatty()
    assert capsys.readouterr().out.splitlines() == ["a line of the command's own",
                                                    "another line, an error from the library"]
    with pytest.raises(RuntimeError), quiet.dropping_lines(quiet.DEEPSPEED_BUILT):  # a failure keeps its lines
        print("DeepSpeed: cannot build the op")
        raise RuntimeError("build failed")
    assert capsys.readouterr().out == "DeepSpeed: cannot build the op\n"


def test_debug_lets_the_known_line_through(capsys, monkeypatch):
    quiet.set_debug(True)
    with quiet.dropping_lines(quiet.DEEPSPEED_BUILT):
        _chatty()
    assert BUILT in capsys.readouterr().out.splitlines()
    quiet.set_debug(False)
    monkeypatch.setenv("TRAJLAKE_DEBUG", "1")  # what reaches the processes a launcher starts
    with quiet.dropping_lines(quiet.DEEPSPEED_BUILT):
        _chatty()
    assert BUILT in capsys.readouterr().out.splitlines()


def test_the_cli_and_the_recipes_debug_option(tmp_path, monkeypatch):
    from trajlake.cli import main
    from trajlake.core import display
    from trajlake.recipes.entry import recipe_args, recipe_parser, run_recipe
    from trajlake.store import Lake

    seen = []
    monkeypatch.setattr(display, "show", lambda df, **kw: seen.append(quiet.debug()))
    Lake.open(str(tmp_path / "lake")).close()  # a lake for `tables` to read
    assert main(["--lake", str(tmp_path / "lake"), "--debug", "tables"]) == 0
    assert main(["--lake", str(tmp_path / "lake"), "tables"]) == 0
    assert seen == [True, False] and not quiet.debug()  # --debug held for its command only
    args = recipe_args(recipe_parser("x", None), ["--debug", "--format", "plain"])
    assert args == {"lake": "lake"} and quiet.debug() and display.table_format() is display.TableFormat.plain
    assert run_recipe(lambda cfg: None, lambda: None) == 0
    assert not quiet.debug() and display.table_format() is display.TableFormat.table


def test_forward_passes_warn_nothing_and_an_unrelated_warning_still_shows(tiny, monkeypatch):
    """transformers >= 5.2x warns (FutureWarning) on every forward pass given `past_key_values=`, and logs a
    deprecation whenever an output's `past_key_values` is read: the sampler's cached decoder and the
    trainer's shared-prefix and packed passes use the current names, so none of it is made; a warning from
    elsewhere is not filtered."""
    from transformers.utils import generic

    from trajlake.collect.policies import Request, SamplingParams
    from trajlake.collect.policies.hf import HFPolicy
    from trajlake.lm.load import load_model, load_tokenizer
    from trajlake.train import forward

    logged = []
    monkeypatch.setattr(generic.logger, "warning_once", lambda msg, *a, **k: logged.append(msg))
    model = load_model(tiny)
    gen = torch.Generator().manual_seed(0)
    shared = torch.randint(3, 2000, (1, 20), generator=gen)
    ids = torch.cat([shared.expand(3, -1), torch.randint(3, 2000, (3, 8), generator=gen)], dim=1)
    attn = torch.ones_like(ids)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        policy = HFPolicy(tiny, model=model, tokenizer=load_tokenizer(tiny))
        assert policy.cache_off is None
        policy.generate([Request("e1", ids[0].tolist(), [])], SamplingParams(temperature=0, max_new_tokens=4))
        with torch.no_grad():
            context = forward.prefix_context(model, shared)
            forward._prefix_forward(model, ids, attn, 20, 9, context)
            forward._prefix_forward(model, ids, attn, 20, 9, None)
            forward._packed_logits(model, ids, attn, 20, 20, context)
            forward._packed_logits(model, ids, attn, 20, 0, None)
        warnings.warn("an unrelated deprecation", FutureWarning, stacklevel=1)
    assert [str(w.message) for w in caught] == ["an unrelated deprecation"]
    assert logged == []
