"""TrainConfig: defaults, cross-field checks with errors saying what to fix, TOML loading, example configs."""

from __future__ import annotations

from pathlib import Path

import pytest

from trajlake.collect.config import CollectConfig, RolloutConfig
from trajlake.core.config_types import HELP, field_docs, leaf_fields
from trajlake.evaluate.config import EvalConfig
from trajlake.interop.importers.config import ImportConfig
from trajlake.train.config import ConfigError, TrainConfig, config_from_dict, load_config

CONFIGS = Path(__file__).resolve().parents[1] / "train" / "configs"


def test_defaults_are_valid():
    c = config_from_dict(dict(model="m"))
    assert c.run.algo == "grpo" and c.advantage_name == "grpo"
    assert config_from_dict(dict(model="m", algo="ppo")).advantage_name == "gae"
    assert c.accum_steps(1) == c.optim.minibatch_size // c.optim.micro_batch
    assert c.accum_steps(2) == c.optim.minibatch_size // (2 * c.optim.micro_batch)


@pytest.mark.parametrize("kw, words", [
    (dict(algo="dpo"), ["algo", "grpo"]),
    (dict(minibatch_size=10, micro_batch=4), ["minibatch_size", "multiple of micro_batch"]),
    (dict(micro_batch=8, minibatch_size=4), ["minibatch_size", ">= micro_batch"]),
    (dict(algo="ppo", advantage="grpo"), ["critic", "gae"]),
    (dict(advantage="gae"), ["needs a critic", "ppo"]),
    (dict(samples=1), ["samples must be >= 2"]),
    (dict(kl_controller="adaptive", kl_coef=0.1), ["kl_target", "kl_horizon"]),
    (dict(kl_controller="adaptive", kl_coef=0.0, kl_target=0.01, kl_horizon=100), ["starting kl_coef > 0"]),
    (dict(policy_loss="dual_clip", clip_c=1.0), ["dual_clip needs clip_c > 1, got 1.0"]),
    (dict(policy_loss="nope"), ["policy_loss", "ppo_clip", "gspo"]),
    (dict(agg_mode="mean"), ["agg_mode", "token-mean"]),
    (dict(kl_estimator="k9"), ["k3"]),
    (dict(zero_stage=4), ["zero_stage"]),
    (dict(dtype="fp16"), ["bf16"]),
    (dict(old_logprobs="replay"), ["unknown old_logprobs 'replay'; valid: behaviour, recompute"]),
    (dict(kl_mode="advantage"), ["unknown kl_mode 'advantage'; valid: loss, reward"]),
    (dict(rollout_engine="sglang"), ["unknown rollout_engine 'sglang'; valid: auto, transformers, vllm"]),
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
        config_from_dict(dict(model="m", **kw))
    for w in words:
        assert w in str(e.value)


def test_a_registered_entrys_own_rule_is_checked_without_the_config_check_naming_it():
    """A new loss or KL controller brings its constraints with it: one registration, and the config check asks
    the entry (`config_problem`), as it asks dual_clip and the adaptive controller."""
    from trajlake.train.algos import KL_CONTROLLERS, POLICY_LOSSES, FixedKLController, ppo_clip_loss
    from trajlake.train.algos.core import register_loss

    register_loss(POLICY_LOSSES, "test_wide_clip", params={"clip_low": "clip_low", "clip_high": "clip_high"},
                  rule=lambda clip_low, clip_high: None if clip_high >= 0.5 else
                  f"test_wide_clip needs clip_high >= 0.5, got {clip_high}")(ppo_clip_loss)

    class NeedsTarget(FixedKLController):
        @classmethod
        def config_problem(cls, config):
            return None if config.kl.target else "test_target needs kl_target"

    KL_CONTROLLERS.add("test_target", NeedsTarget)
    try:
        with pytest.raises(ConfigError, match=r"^train config: test_wide_clip needs clip_high >= 0.5, got 0.28$"):
            config_from_dict(dict(model="m", policy_loss="test_wide_clip", clip_high=0.28))
        wide = config_from_dict(dict(model="m", policy_loss="test_wide_clip", clip_high=0.5))
        assert wide.algorithm.policy_loss == "test_wide_clip"
        with pytest.raises(ConfigError, match=r"^train config: test_target needs kl_target$"):
            config_from_dict(dict(model="m", kl_controller="test_target"))
        targeted = config_from_dict(dict(model="m", kl_controller="test_target", kl_target=0.1))
        assert targeted.kl.controller == "test_target"
    finally:
        POLICY_LOSSES.unregister("test_wide_clip")
        KL_CONTROLLERS.unregister("test_target")


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
    p.write_text(f'model = "m"\nalgo = "sft"\n{line}\n')
    with pytest.raises(ConfigError) as e:
        load_config(p)
    assert str(e.value) == f"{p}: {message}"


def test_an_integer_for_a_float_field_is_that_float(tmp_path):
    p = tmp_path / "c.toml"
    p.write_text('model = "m"\nlr = 1\nloss_norm_constant = 64\n')
    c = load_config(p)
    assert type(c.optim.lr) is float and c.optim.lr == 1.0 and type(c.optim.loss_norm_constant) is float


def test_grad_accum_must_match_processes():
    c = config_from_dict(dict(model="m", minibatch_size=16, micro_batch=4, grad_accum=4))
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
    c = load_config(p, algo="grpo", run_id=None)
    assert c.run.algo == "grpo" and c.optim.lr == 0.001 and c.run.id is None and c.kl.mode == "reward"
    with pytest.raises(ConfigError, match=r"c\.toml: train config: algo sft has no \[kl\] section; leave out "
                                          r"kl_coef, kl_mode$"):
        load_config(p, algo="sft")  # SFT has no KL anchor: the file's settings for one are refused, not dropped
    with pytest.raises(ConfigError, match="model"):
        p.write_text("lr = 0.1\n")
        load_config(p)
    with pytest.raises(ConfigError, match="invalid TOML"):
        p.write_text("lr = = 1\n")
        load_config(p)


@pytest.mark.parametrize("cls", [RolloutConfig, CollectConfig, EvalConfig, TrainConfig, ImportConfig],
                         ids=lambda cls: cls.__name__)
def test_every_field_is_documented_in_its_metadata(cls):
    # a field's help is declared with it (setting/operational/added_later(help=...)) and kept in its metadata,
    # where field_docs, and so the CLI's help, reads it: no class source is parsed
    leaves = leaf_fields(cls)  # a nested config's (TrainConfig's) fields are its sections' fields
    undocumented = [n for n, _, f in leaves
                    if not isinstance(f.metadata.get(HELP), str) or not f.metadata[HELP].strip()]
    assert undocumented == []
    assert field_docs(cls) == {n: " ".join(f.metadata[HELP].split()) for n, _, f in leaves}


@pytest.mark.parametrize("name", sorted(p.name for p in CONFIGS.glob("*.toml")))
def test_example_configs_load(name):
    c = load_config(CONFIGS / name)
    assert c.run.algo in ("grpo", "ppo", "sft")


# ---- numbers and ids: finite, in range, checked before any rule divides by them ----------------------------

@pytest.mark.parametrize("kw, message", [
    (dict(lr=float("inf")), "train config: lr must be a finite number, got inf"),
    (dict(lr=float("nan")), "train config: lr must be a finite number, got nan"),
    (dict(lr=0.0), "train config: lr must be > 0 and at most 1e+30, got 0.0"),
    (dict(lr=-1e-5), "train config: lr must be > 0 and at most 1e+30, got -1e-05"),
    (dict(lr=1e39), "train config: lr must be > 0 and at most 1e+30, got 1e+39"),  # overflowed inside torch
    (dict(critic_lr=2e30), "train config: critic_lr must be > 0 and at most 1e+30, got 2e+30"),
    (dict(critic_lr=float("-inf")), "train config: critic_lr must be a finite number, got -inf"),
    (dict(gamma=float("nan")), "train config: gamma must be a finite number, got nan"),
    (dict(kl_coef=float("inf")), "train config: kl_coef must be a finite number, got inf"),
    (dict(weight_decay=-0.1), "train config: weight_decay must be in [0, 1]"),
    (dict(temperature=float("inf")), "train config: temperature must be a finite number, got inf"),
    (dict(temperature=1000.0), "train config: temperature must be in [0, 100] (0: greedy), got 1000.0"),
    (dict(temperature=0.0), "train config: temperature must be > 0 for training rollouts (log-probs use "
                            "logits / temperature) and at most 100, got 0.0"),
    # micro_batch = 0 was a ZeroDivisionError (minibatch_size % micro_batch)
    (dict(micro_batch=0), "train config: micro_batch must be >= 1, got 0"),
    (dict(minibatch_size=0), "train config: minibatch_size must be >= 1, got 0"),
    (dict(grad_accum=0), "train config: grad_accum must be >= 1, got 0"),
    (dict(tasks=0), "train config: tasks must be >= 1, got 0"),
    (dict(iterations=-1), "train config: iterations must be >= 0, got -1"),
    (dict(critic_warmup=-1), "train config: critic_warmup must be >= 0, got -1"),
    # sft_steps = 10**23 trained without end
    (dict(algo="sft", sft_steps=10**23), "train config: sft_steps must be at most 10_000_000 (the cap on counts: "
                                         "far beyond any run), got 100000000000000000000000"),
    (dict(iterations=10_000_001), "train config: iterations must be at most 10_000_000"),
    (dict(max_new_tokens=10**12), "train config: max_new_tokens must be at most 10_000_000"),
    (dict(seed=-1), "train config: seed must be >= 0, got -1"),
    (dict(seed=2**40), "train config: seed must be at most 2_147_483_647, got 1099511627776"),
    (dict(algo="sft", sft_snapshot=2**64), "train config: sft_snapshot must be at most 9_223_372_036_854_775_807"),
    # an empty run id is refused, not replaced by a generated one; a run id names folders
    (dict(run_id=""), "train config: run_id must not be empty"),
    (dict(run_id="   "), "train config: run_id must not be empty"),
    (dict(run_id="../../outside/escaped"), "train config: run_id '../../outside/escaped' may hold only letters"),
    (dict(run_id="/etc/x"), "train config: run_id '/etc/x' may hold only letters"),
    (dict(run_id="a\\b"), "train config: run_id 'a\\\\b' may hold only letters"),
    (dict(run_id="x" * 129), "train config: run_id is 129 characters long; at most 128"),
])
def test_numbers_and_run_ids_are_checked_naming_the_field(kw, message):
    with pytest.raises(ConfigError) as e:
        config_from_dict(dict(model="m", **kw))
    assert str(e.value).startswith(message), str(e.value)
    assert "\n" not in str(e.value)


def test_numbers_at_their_limits_are_valid():
    from trajlake.train.config import MAX_COUNT

    c = config_from_dict(dict(model="m", lr=1e30, iterations=0, seed=2**31 - 1, temperature=100.0,
                              run_id="a.b_c-1", critic_warmup=0))
    assert c.run.iterations == 0 and c.optim.lr == 1e30  # a huge finite lr is the user's to choose
    assert config_from_dict(dict(model="m", algo="sft", sft_steps=MAX_COUNT)).sft.steps == MAX_COUNT


@pytest.mark.parametrize("line, message", [
    ("lr = inf", "lr must be a finite number, got inf"),
    ("lr = nan", "lr must be a finite number, got nan"),
    ("sft_steps = 1e23", "sft_steps must be an integer, got 1e+23 (float)"),
    ("sft_steps = 9223372036854775807", "sft_steps must be at most 10_000_000"),
    ("micro_batch = 0", "micro_batch must be >= 1, got 0"),
    ('run_id = ""', "run_id must not be empty"),
])
def test_toml_numbers_are_checked(tmp_path, line, message):
    p = tmp_path / "c.toml"
    p.write_text(f'model = "m"\nalgo = "sft"\n{line}\n')
    with pytest.raises(ConfigError) as e:
        load_config(p)
    assert str(e.value) == f"{p}: train config: {message}" or str(e.value).startswith(f"{p}: train config: {message}")


def test_checkpoint_folders_stay_inside_checkpoint_dir(tmp_path):
    """A run id read back from a lake is data: whatever it holds, its checkpoints land in one folder inside
    checkpoint_dir (`../../outside/escaped` wrote them outside), and a symlinked run folder is refused."""
    from trajlake.core.errors import TrajlakeError
    from trajlake.train.checkpoint import checkpoint_path

    root = tmp_path / "ckpt"
    assert checkpoint_path(root, "r1", 3) == root / "r1" / "step-3"
    for rid in ("../../outside/escaped", "..", ".", "a/b", "a\\b", "x\x00y", "/etc/passwd", "é" * 300):
        p = checkpoint_path(root, rid, 1)
        assert p.parent.parent == root and p.resolve().is_relative_to(root.resolve()), (rid, p)
        assert p.parent.name not in (".", "..") and "/" not in p.parent.name
    assert checkpoint_path(root, "a/b", 1) != checkpoint_path(root, "a_b", 1)  # distinct ids, distinct folders
    root.mkdir()
    (tmp_path / "elsewhere").mkdir()
    (root / "linked").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(TrajlakeError, match=r"^run 'linked': its checkpoint folder .* outside checkpoint_dir"):
        checkpoint_path(root, "linked", 1)
