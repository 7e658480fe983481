"""rollout_engine `auto`: the faster engine for the run at hand, by a rule from measured speeds, printed and
recorded with the run; a named engine is played as named."""

from __future__ import annotations

import pytest

from trajlake.train.config import ConfigError
from trajlake.train.rollout_engines import (
    HF_TOKENS_PER_S,
    MIN_VLLM_PARAMS,
    VLLM_STARTUP_S,
    VLLM_TOKENS_PER_S,
    EngineFacts,
    choose_engine,
    resolve_engine,
)

SMOLLM2 = 134_515_008
#: the tokens at which vLLM's speed pays for its startup
BREAK_EVEN = VLLM_STARTUP_S / (1 / HF_TOKENS_PER_S - 1 / VLLM_TOKENS_PER_S)


@pytest.mark.parametrize("facts, engine, why", [
    (EngineFacts(SMOLLM2, 10**7, vllm_installed=False), "transformers", "vLLM is not installed"),
    (EngineFacts(1_000_000, 10**7, vllm_installed=True), "transformers", "a 1.0M-parameter model"),
    (EngineFacts(SMOLLM2, int(BREAK_EVEN) - 1, vllm_installed=True), "transformers", "less than its 37 s startup"),
    (EngineFacts(SMOLLM2, int(BREAK_EVEN) + 1, vllm_installed=True), "vllm", "more than its 37 s startup"),
    (EngineFacts(MIN_VLLM_PARAMS, 10**6, vllm_installed=True), "vllm", "tokens to generate"),
])
def test_auto_chooses_by_the_measured_speeds(facts, engine, why):
    got, reason = choose_engine(facts)
    assert got == engine and why in reason


def test_a_named_engine_is_played_as_named_without_asking_for_facts():
    def never():
        raise AssertionError("facts are read only for auto")

    assert resolve_engine("transformers", never) == ("transformers", "as configured")
    assert resolve_engine("vllm", never) == ("vllm", "as configured")
    assert resolve_engine("auto", lambda: EngineFacts(SMOLLM2, 10**7, True))[0] == "vllm"


def test_an_unknown_engine_lists_the_valid_ones(tiny):
    from tests.helpers import small_cfg

    with pytest.raises(ConfigError, match=r"unknown rollout_engine 'sglang'; valid: auto, transformers, vllm"):
        small_cfg(tiny, rollout_engine="sglang")


def test_an_auto_run_prints_and_records_its_choice(tiny, lake, capsys):
    """Here vLLM is not installed (it has a venv of its own): auto plays on transformers, says why, and the run's
    stored config records it."""
    from tests.helpers import small_cfg
    from trajlake.store import runs
    from trajlake.train.loop import train

    pytest.importorskip("transformers")
    cfg = small_cfg(tiny, run_id="auto-engine", tasks=2, samples=2, iterations=1, minibatch_size=4, micro_batch=2,
                    progress=True)
    assert cfg.rollout.engine == "auto"  # the default
    train(cfg, lake)
    assert runs.stored(lake, "auto-engine").config["rollout_engine_chosen"] == "transformers"
    out = capsys.readouterr()
    assert "rollout engine: transformers (auto: " in out.out + out.err
