"""The learning test: on doors difficulty 1 (one step: open the door the text names), a warm start by SFT on
scripted-expert episodes collected into the store, then GRPO iterations, raises the held-out (split test)
greedy success rate measurably; and GRPO with two async collectors beside the learner (`async_collectors`),
on the same warm start and budget, ends at least where the synchronous loop does (within 3 of 100 tasks).
Slow (a few minutes each on a CPU), meant to run in CI: `pytest -m slow`.

Measured here (2 shared CPU cores, ~1M-parameter model, ~4 min): SFT 50 steps -> greedy 57% on the test
tasks, sampled (T = 0.7) 9%; after 40 GRPO iterations (64 tasks x 4 samples) greedy 85%, sampled 77%.
"""

from __future__ import annotations

import pytest

from tests.helpers import small_cfg, tiny_model_dir
from trajlake.collect.config import CollectConfig
from trajlake.collect.rollout import collect
from trajlake.store import Lake
from trajlake.train.loop import train

SYSTEM = "Open the door with the key. Reply: open COLOR."
COMMON = dict(template="plain", system_prompt=SYSTEM, difficulty=1, max_turns=1, max_new_tokens=8)
#: "at least the synchronous loop's success" allows this much: 3 of the 100 held-out tasks, well inside either
#: number's 95% interval (both loops reached 1.00 here, 2026-11-28)
SAME_WITHIN = 0.03
#: the GRPO budget both loops get: 40 updates of 64 tasks x 4 samples, evaluated on 100 held-out tasks
GRPO = dict(algo="grpo", tasks=64, samples=4, iterations=40, lr=2e-4, epochs=2, minibatch_size=64, micro_batch=32,
            temperature=0.7, grad_clip=1.0, eval_every=40, eval_tasks=100, **COMMON)


@pytest.fixture(scope="module")
def warm(tmp_path_factory):
    """(model, lake URI, checkpoint folder, the SFT warm start's policy id), in a SQLite-catalog lake (which the
    async collectors' processes can write too)."""
    model = tiny_model_dir(tmp_path_factory)
    folder = tmp_path_factory.mktemp("learning")
    uri = f"sqlite:{folder / 'lake.sqlite'}"
    with Lake.open(uri) as lake:
        collect(CollectConfig(env="doors", policy="scripted:doors", tokenizer=str(model), tasks=256,
                              run_id="expert", progress=False, **{k: COMMON[k] for k in
                                                                  ("template", "system_prompt", "difficulty")}),
                lake)
        warm = train(small_cfg(model, algo="sft", run_id="warm", sft_filter="success AND policy_id LIKE 'scripted:%'",
                               sft_steps=50, lr=1e-3, minibatch_size=16, micro_batch=16, log_every=50,
                               checkpoint_dir=str(folder / "ckpt"), **COMMON), lake)
    return model, uri, folder / "ckpt", warm.policy_id


@pytest.fixture(scope="module")
def synchronous(warm):
    """The synchronous loop's GRPO run from the warm start: its history."""
    model, uri, ckpt, start = warm
    with Lake.open(uri) as lake:
        return train(small_cfg(f"policy:{start}", run_id="rl", checkpoint_dir=str(ckpt), **GRPO), lake).history


@pytest.mark.slow
def test_sft_warm_start_then_grpo_raises_held_out_success(warm, synchronous):
    before, after = synchronous[0]["eval_success"], synchronous[-1]["eval_success"]
    sampled = [h["success_mean"] for h in synchronous[1:]]
    print(f"held-out greedy success {before:.2f} -> {after:.2f}; sampled {sampled[0]:.2f} -> {sampled[-1]:.2f}")
    assert after >= before + 0.15, (before, after)
    assert sum(sampled[-5:]) / 5 >= sum(sampled[:5]) / 5 + 0.3, sampled
    # the store holds the whole story: every iteration's policy, batch snapshot and metrics
    with Lake.open(warm[1]) as lake:
        steps = lake.query("SELECT count(*) AS n, count(DISTINCT snapshot_read) AS s FROM train_steps "
                           "WHERE run_id = 'rl' AND policy_id IS NOT NULL").to_dicts()[0]
    assert steps == {"n": 40, "s": 40}


@pytest.mark.slow
def test_async_collectors_train_at_least_as_well_as_the_synchronous_loop(warm, synchronous):
    model, uri, ckpt, start = warm
    with Lake.open(uri) as lake:
        # is_cap = 2, the setting docs/train.md recommends: with old_logprobs = "behaviour" one CI run here ended
        # at 0.90 against the synchronous loop's 1.00 (2026-11-28), where is_cap matched or beat it on doors d3
        rl = train(small_cfg(f"policy:{start}", run_id="rl-async", checkpoint_dir=str(ckpt), async_collectors=2,
                             is_cap=2.0, **GRPO), lake).history
    before, after, sync_after = rl[0]["eval_success"], rl[-1]["eval_success"], synchronous[-1]["eval_success"]
    print(f"held-out greedy success {before:.2f} -> async {after:.2f}; synchronous {sync_after:.2f}")
    assert after >= sync_after - SAME_WITHIN, (after, sync_after)
    assert max(h["staleness_mean"] for h in rl[1:]) <= 1
