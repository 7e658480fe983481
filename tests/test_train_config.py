"""TrainConfig: defaults, cross-field checks with errors saying what to fix, TOML loading, example configs."""

from __future__ import annotations

from pathlib import Path

import pytest

from trajlake.train.config import ConfigError, TrainConfig, load_config

CONFIGS = Path(__file__).resolve().parents[1] / "train" / "configs"


def test_defaults_are_valid():
    c = TrainConfig(model="m")
    assert c.algo == "grpo" and c.advantage_name == "grpo"
    assert TrainConfig(model="m", algo="ppo").advantage_name == "gae"
    assert c.accum_steps(1) == c.minibatch_size // c.micro_batch
    assert c.accum_steps(2) == c.minibatch_size // (2 * c.micro_batch)


@pytest.mark.parametrize("kw, words", [
    (dict(algo="dpo"), ["algo", "grpo"]),
    (dict(minibatch_size=10, micro_batch=4), ["minibatch_size", "multiple of micro_batch"]),
    (dict(micro_batch=8, minibatch_size=4), ["minibatch_size", ">= micro_batch"]),
    (dict(algo="ppo", advantage="grpo"), ["critic", "gae"]),
    (dict(advantage="gae"), ["needs a critic", "ppo"]),
    (dict(samples=1), ["samples must be >= 2"]),
    (dict(kl_controller="adaptive", kl_coef=0.1), ["kl_target", "kl_horizon"]),
    (dict(policy_loss="nope"), ["policy_loss", "ppo_clip", "gspo"]),
    (dict(agg_mode="mean"), ["agg_mode", "token-mean"]),
    (dict(kl_estimator="k9"), ["k3"]),
    (dict(zero_stage=4), ["zero_stage"]),
    (dict(dtype="fp16"), ["bf16"]),
    (dict(old_logprobs="replay"), ["recompute", "behaviour"]),
    (dict(is_cap=2.0, old_logprobs="behaviour"), ["is_cap", "recompute"]),
    (dict(grad_accum=3, minibatch_size=16, micro_batch=4), ["grad_accum"]),
    (dict(temperature=0.0), ["temperature"]),
    (dict(top_p=0.0), ["top_p must be in (0, 1]"]),
    (dict(split="dev"), ["split must be one of train, val, test, got 'dev'"]),
    (dict(eval_split="dev"), ["eval_split must be one of train, val, test, got 'dev'"]),
    (dict(max_new_tokens=2048), ["max_context_tokens (2048) must exceed max_new_tokens (2048)"]),
    (dict(template="xml"), ["unknown template 'xml'", "think_action"]),
    (dict(difficulty=9), ["difficulty 9 is not a level of env doors; valid: 1, 2, 3, 4"]),
])
def test_cross_field_errors_say_what_to_fix(kw, words):
    with pytest.raises(ConfigError) as e:
        TrainConfig(model="m", **kw)
    for w in words:
        assert w in str(e.value)


@pytest.mark.parametrize("line, message", [
    ('lr = "fast"', "train config: lr must be a number, got 'fast' (str)"),
    ("tasks = true", "train config: tasks must be an integer, got True (bool)"),
    ("tasks = 2.5", "train config: tasks must be an integer, got 2.5 (float)"),
    ('difficulty = "1"', "train config: difficulty must be an integer (or left unset), got '1' (str)"),
    ("system_prompt = 3", "train config: system_prompt must be a string (or left unset), got 3 (int)"),
    ('progress = "no"', "train config: progress must be true or false, got 'no' (str)"),
    ("kl_target = [1]", "train config: kl_target must be a number (or left unset), got [1] (list)"),
])
def test_toml_field_types_are_checked_naming_the_field(tmp_path, line, message):
    """A wrong type is an error naming the field and the type it wants, before any check compares it (`lr =
    "fast"` used to fail with "'>' not supported between instances of 'str' and 'int'")."""
    p = tmp_path / "c.toml"
    p.write_text(f'model = "m"\n{line}\n')
    with pytest.raises(ConfigError) as e:
        load_config(p)
    assert str(e.value) == f"{p}: {message}"


def test_an_integer_for_a_float_field_is_that_float(tmp_path):
    p = tmp_path / "c.toml"
    p.write_text('model = "m"\nlr = 1\nloss_norm_constant = 64\n')
    c = load_config(p)
    assert type(c.lr) is float and c.lr == 1.0 and type(c.loss_norm_constant) is float


def test_grad_accum_must_match_processes():
    c = TrainConfig(model="m", minibatch_size=16, micro_batch=4, grad_accum=4)
    assert c.accum_steps(1) == 4
    with pytest.raises(ConfigError, match="processes"):
        c.accum_steps(2)


def test_toml_unknown_keys_named(tmp_path):
    p = tmp_path / "c.toml"
    p.write_text('model = "m"\nlearning_rate = 0.1\nepochz = 2\n')
    with pytest.raises(ConfigError) as e:
        load_config(p)
    assert "epochz" in str(e.value) and "learning_rate" in str(e.value) and str(p) in str(e.value)


def test_toml_roundtrip_and_overrides(tmp_path):
    p = tmp_path / "c.toml"
    p.write_text('model = "m"\nalgo = "ppo"\nlr = 0.001\nkl_coef = 0.1\nkl_mode = "reward"\n')
    c = load_config(p, algo="sft", run_id=None)
    assert c.algo == "sft" and c.lr == 0.001 and c.run_id is None
    with pytest.raises(ConfigError, match="model"):
        p.write_text("lr = 0.1\n")
        load_config(p)
    with pytest.raises(ConfigError, match="invalid TOML"):
        p.write_text("lr = = 1\n")
        load_config(p)


def test_every_field_is_documented():
    import dataclasses

    from trajlake.config_types import field_docs

    docs = field_docs(TrainConfig)
    assert [f.name for f in dataclasses.fields(TrainConfig) if not docs.get(f.name)] == []


@pytest.mark.parametrize("name", sorted(p.name for p in CONFIGS.glob("*.toml")))
def test_example_configs_load(name):
    c = load_config(CONFIGS / name)
    assert c.algo in ("grpo", "ppo", "sft")
