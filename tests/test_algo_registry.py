"""Algorithms and advantage estimators are registry entries: a new critic-based estimator, a new group
estimator and a new algo are each one registration, which the config checks, the trainer's turn inputs and
loops, and the replay grouping read; unknown names list the valid ones. Every registration a test makes is
removed at its end (the `scratch` fixture)."""

from __future__ import annotations

import itertools

import pytest
import torch

from tests.helpers import small_cfg, synthetic, tiny_model_dir
from trajlake.core.registry import Registry, UnknownNameError
from trajlake.store import Lake
from trajlake.train.algos import (
    ADVANTAGES,
    ALGOS,
    KL_CONTROLLERS,
    RL_LOOP,
    SFT_LOOP,
    Advantage,
    Algo,
    compute_advantages,
    compute_gae,
    group_index,
    register_advantage,
    register_algo,
)
from trajlake.train.batch import collate
from trajlake.train.config import ConfigError, config_from_dict
from trajlake.train.loop import train
from trajlake.train.steps import turn_inputs

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture
def scratch():
    """Whatever a test registers in ADVANTAGES or ALGOS is unregistered when it ends, passed or failed."""
    before = {registry: set(registry) for registry in (ADVANTAGES, ALGOS)}
    yield
    for registry, names in before.items():
        for name in set(registry) - names:
            if name in registry:  # an alias goes with its entry
                registry.unregister(name)
        assert set(registry) == names, f"a test took built-in {registry.kind}s out"


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return tiny_model_dir(tmp_path_factory)


@pytest.fixture
def lake(tmp_path):
    lk = Lake.open(str(tmp_path / "lake"))
    yield lk
    lk.close()


def monte_carlo_minus_value(*, token_level_rewards, mask, values=None, gamma=1.0, **_ignored):
    """Advantage = the discounted return-to-go over agent tokens minus the critic's value there (GAE with
    lam = 1); returns = the return-to-go. (B, T) each, zero outside the mask."""
    if values is None:
        raise ValueError("monte_carlo_minus_value needs values")
    on = mask > 0
    returns = torch.zeros_like(token_level_rewards, dtype=torch.float64)
    running = torch.zeros(mask.shape[0], dtype=torch.float64)
    for t in range(mask.shape[1] - 1, -1, -1):
        running = torch.where(on[:, t], token_level_rewards[:, t] + gamma * running, running)
        returns[:, t] = torch.where(on[:, t], running, 0.0)
    advantages = torch.where(on, returns - values, 0.0)
    return advantages.float(), returns.float()


def median_baseline(*, token_level_rewards, mask, group_ids=None, **_ignored):
    """Each sequence's score (its summed token rewards) minus its group's median score, on its agent tokens."""
    scores = (token_level_rewards * mask).sum(-1)
    groups = group_index(group_ids)
    medians = torch.stack([scores[groups == g].median() for g in groups.tolist()])
    advantages = (scores - medians).unsqueeze(-1) * mask
    return advantages, advantages.clone()


def test_a_critic_estimator_is_one_registration(scratch):
    register_advantage("mc_value", needs_critic=True)(monte_carlo_minus_value)
    estimator = ADVANTAGES["mc_value"]
    assert isinstance(estimator, Advantage) and estimator.needs_critic and not estimator.group_relative
    # called as every estimator is, it is GAE with lam = 1
    g = torch.Generator().manual_seed(0)
    rewards, values = torch.randn(3, 6, generator=g), torch.randn(3, 6, generator=g)
    mask = torch.tensor([[0, 1, 1, 0, 1, 1], [1, 1, 1, 1, 0, 0], [0, 0, 1, 0, 0, 1]], dtype=torch.float32)
    kw = dict(token_level_rewards=rewards, mask=mask, values=values, group_ids=[0, 0, 1], gamma=0.9, lam=0.5,
              whiten=False, norm_by_std=True)
    adv, ret = compute_advantages("mc_value", **kw)
    want_adv, want_ret = compute_gae(**kw | {"lam": 1.0})
    torch.testing.assert_close(adv, want_adv)
    torch.testing.assert_close(ret, want_ret)
    # ppo (the algo with a critic) takes it; grpo (none) refuses it and says where it runs
    cfg = config_from_dict(dict(model="m", algo="ppo", advantage="mc_value"))
    assert cfg.advantage_name == "mc_value" and ALGOS[cfg.run.algo].needs_critic
    with pytest.raises(ConfigError, match="advantage mc_value needs a critic: use algo ppo"):
        config_from_dict(dict(model="m", algo="grpo", advantage="mc_value"))
    with pytest.raises(ConfigError, match="algo ppo trains a critic for advantage gae or mc_value or turn_gae"):
        config_from_dict(dict(model="m", algo="ppo", advantage="grpo"))
    assert turn_inputs("mc_value", collate(synthetic(2), 0), cfg) == {}  # token-level, no settings


@pytest.mark.slow  # one real PPO iteration: the registration alone is checked by the tests above
def test_ppo_trains_with_a_registered_critic_estimator(scratch, model, lake):
    register_advantage("mc_value", needs_critic=True)(monte_carlo_minus_value)
    cfg = small_cfg(model, algo="ppo", advantage="mc_value", run_id="mc", tasks=2, samples=1, iterations=1,
                    minibatch_size=2, micro_batch=2, critic_lr=1e-3)
    res = train(cfg, lake)
    metrics = lake.query("SELECT metrics->>'critic_vf_loss' AS vf FROM train_steps WHERE run_id = 'mc'")
    assert res.step == 1 and metrics["vf"][0] is not None, "the critic was built and trained"


class HalvingKL:
    """A KL controller registered by a test: the coefficient halves after each update."""

    def __init__(self, kl_coef):
        self.value = float(kl_coef)

    @classmethod
    def from_settings(cls, kl_coef, *, target_kl=None, horizon=None):
        return cls(kl_coef)

    @classmethod
    def config_problem(cls, config):
        return None if config.kl.coef > 0 else "kl_controller halving_test needs a starting kl_coef > 0"

    def update(self, current_kl, n_steps):
        self.value /= 2

    def state_dict(self):
        return {"value": self.value}

    def load_state_dict(self, state):
        self.value = float(state["value"])


def test_a_kl_controller_is_one_registration(model, lake):
    """Registered, it is a valid kl_controller, its own rule refuses a config, and the loop follows it."""
    KL_CONTROLLERS.register("halving_test")(HalvingKL)
    try:
        with pytest.raises(ConfigError, match="kl_controller halving_test needs a starting kl_coef > 0"):
            config_from_dict(dict(model="m", kl_controller="halving_test", kl_coef=0.0))
        # every row updated (and its KL measured) even where the untrained model's two samples tie
        train(small_cfg(model, run_id="kl", tasks=2, samples=2, iterations=2, minibatch_size=4, kl_coef=0.04,
                        kl_controller="halving_test", drop_zero_advantage=False), lake)
        coefs = lake.query("SELECT (metrics->>'kl_coef')::DOUBLE AS c FROM train_steps WHERE run_id = 'kl' "
                           "ORDER BY step")["c"].to_list()
        assert coefs == pytest.approx([0.02, 0.01])
    finally:
        KL_CONTROLLERS.unregister("halving_test")
    with pytest.raises(ConfigError, match="unknown kl_controller 'halving_test'; valid: adaptive, fixed"):
        config_from_dict(dict(model="m", kl_controller="halving_test", kl_coef=0.04))


def test_a_group_estimator_needs_two_samples(scratch):
    register_advantage("median_baseline", group_relative=True)(median_baseline)
    estimator = ADVANTAGES["median_baseline"]
    assert estimator.min_group_size == 2 and not estimator.needs_critic
    with pytest.raises(ConfigError, match="median_baseline compares the samples of a task: samples must be >= 2, "
                                          "got 1"):
        config_from_dict(dict(model="m", advantage="median_baseline", samples=1))
    assert config_from_dict(dict(model="m", advantage="median_baseline", samples=2)).advantage_name == "median_baseline"
    with pytest.raises(ConfigError, match="algo ppo trains a critic"):
        config_from_dict(dict(model="m", algo="ppo", advantage="median_baseline", samples=2))
    mask = torch.ones(4, 2)
    adv, _ = estimator(token_level_rewards=torch.tensor([[0, 1.0], [0, 3.0], [0, 2.0], [0, 2.0]]), mask=mask,
                       group_ids=["a", "a", "b", "b"])
    assert adv[:, 0].tolist() == [0.0, 2.0, 0.0, 0.0]  # torch's median of an even group is its lower middle


def turn_scaled(*, token_level_rewards, mask, turn_index=None, weight=1.0, **_ignored):
    """A turn-level toy: each agent token of turn k gets weight * (k + 1)."""
    adv = weight * (turn_index + 1).clamp(min=0).to(token_level_rewards.dtype) * mask
    return adv, adv.clone()


def test_a_turn_estimator_declares_its_inputs_and_settings(scratch):
    register_advantage("turn_scaled", turn_inputs=("turn_index",), params={"weight": "step_advantage_weight"})(
        turn_scaled)

    seqs = synthetic(2)
    for s in seqs:  # the synthetic episodes are two turns: prompt, reply, prompt, reply
        p1, r1, p2, r2 = (len(list(run)) for _, run in itertools.groupby(s.mask))
        s.turn_lengths, s.observations = [(p1, r1), (p2, r2)], ["start", "next"]
    batch = collate(seqs, 0)
    cfg = config_from_dict(dict(model="m", advantage="turn_scaled", step_advantage_weight=0.5))
    given = turn_inputs("turn_scaled", batch, cfg)
    assert set(given) == {"turn_index", "weight"} and given["weight"] == 0.5
    assert torch.equal(given["turn_index"], batch.turn_index)
    adv, _ = ADVANTAGES["turn_scaled"](token_level_rewards=batch.token_rewards, mask=batch.loss_mask, **given)
    assert set(adv[batch.loss_mask > 0].tolist()) == {0.5, 1.0}  # turn 0 -> 0.5, turn 1 -> 1.0
    # the built-in ones get their own settings, by their entries (no signature sniffing)
    assert set(turn_inputs("gigpo", batch, cfg)) == {"turn_index", "step_keys", "step_advantage_weight"}
    assert set(turn_inputs("turn_reinforce", batch, cfg)) == {"turn_index", "baseline"}
    assert set(turn_inputs("turn_gae", batch, cfg)) == {"turn_index"}
    with pytest.raises(Exception, match="turn_scaled needs the turn structure"):
        turn_inputs("turn_scaled", collate(synthetic(2), 0), cfg)


def test_a_registered_turn_estimator_refuses_a_discounting_spec(scratch, model, lake, tmp_path):
    register_advantage("turn_scaled", turn_inputs=("turn_index",))(turn_scaled)
    spec = tmp_path / "disc.toml"
    spec.write_text('name = "disc"\n[allocation]\nstrategy = "discounted"\ngamma = 0.9\n'
                    '[[components]]\nkind = "goal"\n')
    cfg = small_cfg(model, advantage="turn_scaled", run_id="d", tasks=2, samples=2, iterations=1,
                    reward_spec=str(spec))
    with pytest.raises(ConfigError, match="advantage turn_scaled discounts across turns itself"):
        train(cfg, lake)
    assert lake.query("SELECT count(*) FROM runs")[0, 0] == 0


def test_a_new_algo_is_one_registration(scratch):
    algo = register_algo("reinforce", loop=RL_LOOP, default_advantage="reinforce_plus_plus")
    assert ALGOS["reinforce"] is algo and isinstance(algo, Algo)
    cfg = config_from_dict(dict(model="m", algo="reinforce"))
    assert cfg.advantage_name == "reinforce_plus_plus" and algo.counter == "iterations"
    assert not algo.needs_critic and algo.needs_reference(cfg) is True  # the default KL anchor
    assert algo.needs_reference(cfg.replace(kl_coef=0.0)) is False
    assert config_from_dict(dict(model="m", algo="reinforce", advantage="rloo")).advantage_name == "rloo"
    with pytest.raises(ConfigError, match="advantage gae needs a critic: use algo ppo"):
        config_from_dict(dict(model="m", algo="reinforce", advantage="gae"))
    with pytest.raises(ConfigError, match="use algo grpo or reinforce for critic-free estimators"):
        config_from_dict(dict(model="m", algo="ppo", advantage="rloo"))
    # an actor-critic alias of ppo, and an SFT-loop algo
    register_algo("actor_critic", loop=RL_LOOP, default_advantage="turn_gae", needs_critic=True)
    assert config_from_dict(dict(model="m", algo="actor_critic")).advantage_name == "turn_gae"
    with pytest.raises(ConfigError, match="advantage gae needs a critic: use algo actor_critic or ppo"):
        config_from_dict(dict(model="m", algo="grpo", advantage="gae"))
    register_algo("imitation", loop=SFT_LOOP, default_advantage="grpo")
    assert ALGOS["imitation"].counter == "sft_steps" and not ALGOS["imitation"].needs_reference(cfg)
    with pytest.raises(ConfigError, match="algo imitation needs sft_filter"):
        config_from_dict(dict(model="m", algo="imitation", sft_filter=" "))
    with pytest.raises(ConfigError, match="horizon_start caps the turns of the rollouts actor_critic, grpo, ppo "
                                          "and reinforce collect: not with algo imitation or sft"):
        config_from_dict(dict(model="m", algo="imitation", sft_filter="success", horizon_start=1))


def test_train_runs_the_loop_the_algo_names(scratch, model, lake):
    """Each refusal below comes from one loop's own first read, before any write: which loop ran."""
    register_algo("imitation", loop=SFT_LOOP, default_advantage="grpo")
    register_algo("reinforce", loop=RL_LOOP, default_advantage="reinforce_plus_plus")
    with pytest.raises(ConfigError, match="no episodes match sft_filter"):
        train(small_cfg(model, algo="imitation", run_id="i", sft_filter="false", minibatch_size=4), lake)
    with pytest.raises(ConfigError, match="train_filter 'false' matches no episodes"):
        train(small_cfg(model, algo="reinforce", run_id="r", train_filter="false", old_logprobs="behaviour"), lake)
    assert lake.query("SELECT count(*) FROM runs")[0, 0] == 0


def test_a_plain_registration_is_a_token_level_critic_free_estimator(scratch):
    @ADVANTAGES.register("outcome_sign_test")
    def outcome_sign(*, token_level_rewards, mask, **_ignored):
        adv = torch.sign(token_level_rewards.sum(-1, keepdim=True)).expand_as(mask) * mask
        return adv, adv

    assert callable(outcome_sign) and not isinstance(outcome_sign, Advantage), "the decorator returns the function"
    assert ADVANTAGES["outcome_sign_test"] == Advantage(outcome_sign)
    one_sample = config_from_dict(dict(model="m", advantage="outcome_sign_test", samples=1))
    assert one_sample.advantage_name == "outcome_sign_test"
    with pytest.raises(ConfigError, match="algo ppo trains a critic"):
        config_from_dict(dict(model="m", algo="ppo", advantage="outcome_sign_test"))


def test_registrations_that_cannot_work_are_refused():
    with pytest.raises(ValueError, match="turn inputs of turn_index, step_keys, got 'observations'"):
        Advantage(monte_carlo_minus_value, turn_inputs=("observations",))
    with pytest.raises(ValueError, match="loops rl, sft, got 'dpo'"):
        Algo("dpo", default_advantage="grpo")
    with pytest.raises(ValueError, match="only the rl loop trains a critic"):
        Algo(SFT_LOOP, default_advantage="gae", needs_critic=True)
    with pytest.raises(ValueError, match="does not accept its own default advantage 'gae'"):
        register_algo("critic_free", loop=RL_LOOP, default_advantage="gae")
    with pytest.raises(UnknownNameError, match="valid names: .*grpo"):
        register_algo("typo", loop=RL_LOOP, default_advantage="grp")
    assert "critic_free" not in ALGOS and "typo" not in ALGOS
    with pytest.raises(ValueError, match="advantage estimator 'grpo' is already registered"):
        register_advantage("grpo")(median_baseline)


def test_unknown_names_list_the_valid_ones():
    with pytest.raises(UnknownNameError, match="unknown algo 'dpo'; valid names: grpo, ppo, sft"):
        ALGOS["dpo"]
    with pytest.raises(ConfigError, match="algo must be one of grpo, ppo, sft, got 'dpo'"):
        config_from_dict(dict(model="m", algo="dpo"))
    with pytest.raises(ConfigError, match="unknown advantage 'mc'; valid: .*gae.*gigpo.*rloo"):
        config_from_dict(dict(model="m", advantage="mc"))
    from trajlake.train.config_checks import registries

    assert list(registries().ALGOS) == ["grpo", "ppo", "sft"] and registries().ALGOS is ALGOS


def test_unregister_takes_the_entry_and_its_aliases():
    registry: Registry[str] = Registry("thing")
    registry.add("a", "entry", "alias")
    registry.add("b", "other")
    assert registry.unregister("alias") == "entry"
    assert list(registry) == ["b"]
    with pytest.raises(UnknownNameError, match="unknown thing 'a'; valid names: b"):
        registry.unregister("a")
