"""Batches from the store: exact sequences (== collect.chat.full_sequence), masks, rewards, groups, packing."""

from __future__ import annotations

import math
import random

import pytest
import torch

from tests.helpers import SYSTEM, tiny_model_dir
from trajlake.collect.chat import full_sequence
from trajlake.collect.config import CollectConfig
from trajlake.collect.rollout import collect
from trajlake.core.errors import TrajlakeError
from trajlake.rewards import default_spec
from trajlake.rewards.score import score
from trajlake.store import Lake
from trajlake.train.batch import collate, load_episodes, micro_batches, padding_waste, shard


@pytest.fixture(scope="module")
def stored(tmp_path_factory):
    """A lake with multi-turn scripted episodes (doors difficulty 2: read the sign, then open) and sampled
    episodes of the tiny model (with behaviour logprobs), scored with the default spec."""
    model = tiny_model_dir(tmp_path_factory)
    lake = Lake.open(str(tmp_path_factory.mktemp("batchlake") / "lake"))
    collect(CollectConfig(env="doors", policy="scripted:doors", tokenizer=str(model), tasks=6, samples=2,
                          difficulty=2, run_id="expert", progress=False, template="action"), lake)
    collect(CollectConfig(env="doors", policy=f"hf:{model}", tasks=3, samples=2, difficulty=1, max_turns=2,
                          run_id="sampled", progress=False, template="action", system_prompt=SYSTEM,
                          max_new_tokens=8), lake)
    spec = default_spec()
    score(lake, spec)
    yield lake, spec
    lake.close()


def _turns(lake, episode_id, snap):
    return lake.query("SELECT prompt_token_ids, response_token_ids, response_logprobs FROM turns "
                      "WHERE episode_id = ? ORDER BY turn", [episode_id], snapshot=snap).to_dicts()


def test_sequences_equal_full_sequence(stored):
    lake, spec = stored
    snap = lake.current_snapshot()
    seqs = load_episodes(lake, "true", snapshot=snap, spec_id=spec.spec_id)
    assert len(seqs) == 6 * 2 + 3 * 2
    multi = 0
    for s in seqs:
        turns = _turns(lake, s.episode_id, snap)
        multi += len(turns) > 1
        ids, mask = full_sequence(turns)
        assert (s.ids, s.mask) == (ids, mask)
    assert multi >= 12  # the scripted doors-2 episodes have two turns


def test_rewards_and_groups_match_the_store(stored):
    lake, spec = stored
    snap = lake.current_snapshot()
    seqs = load_episodes(lake, "true", snapshot=snap, spec_id=spec.spec_id)
    view = lake.query("SELECT episode_id, position, reward FROM token_rewards WHERE spec_id = ?", [spec.spec_id],
                      snapshot=snap).to_dicts()
    want = {}
    for r in view:
        want.setdefault(r["episode_id"], {})[r["position"]] = r["reward"]
    groups = dict(lake.query("SELECT episode_id, group_id FROM episodes").iter_rows())
    totals = dict(lake.query("SELECT episode_id, total FROM episode_rewards WHERE spec_id = ?",
                             [spec.spec_id]).iter_rows())
    for s in seqs:
        got = {i: r for i, r in enumerate(s.rewards) if r != 0}
        assert got == pytest.approx(want.get(s.episode_id, {}))
        # default spec: last_token allocation, so the reward is the total, on the last agent token
        last = max(i for i, m in enumerate(s.mask) if m)
        assert set(got) <= {last} and s.rewards[last] == pytest.approx(totals[s.episode_id])
        assert s.group_id == groups[s.episode_id] and s.score == pytest.approx(totals[s.episode_id])
    assert len({s.group_id for s in seqs}) == 6 + 3  # K = 2 samples per group


@pytest.mark.parametrize("strategy", ["discounted", "uniform_positive"])
def test_multi_token_spans_fill_every_agent_token_as_token_rewards_does(stored, strategy):
    """Allocations that reward every agent token come as one span per segment: the batch fills each span's
    positions, exactly the rows of the per-token view."""
    from trajlake.rewards import parse_spec

    lake, _ = stored
    spec = parse_spec(f'name = "{strategy}"\n[allocation]\nstrategy = "{strategy}"\ngamma = 0.9\n'
                      '[[components]]\nkind = "sql"\nexpr = "1.0 + num_turns"\n', source="test")
    score(lake, spec)
    snap = lake.current_snapshot()
    seqs = load_episodes(lake, "true", snapshot=snap, spec_id=spec.spec_id)
    view = lake.query("SELECT episode_id, position, reward FROM token_rewards WHERE spec_id = ?", [spec.spec_id],
                      snapshot=snap).rows()
    want = {}
    for e, pos, r in view:
        want.setdefault(e, {})[pos] = r
    for s in seqs:
        got = {i: r for i, r in enumerate(s.rewards) if r != 0}
        assert got == want[s.episode_id]  # the same values, not only close: a span carries the view's value
        assert set(got) == {i for i, m in enumerate(s.mask) if m}  # every agent token, nothing else


def test_behaviour_logprobs_aligned(stored):
    lake, spec = stored
    snap = lake.current_snapshot()
    for s in load_episodes(lake, "run_id = 'sampled'", snapshot=snap):
        stored_lp = [x for t in _turns(lake, s.episode_id, snap) for x in t["response_logprobs"]]
        got = [b for b, m in zip(s.behaviour, s.mask, strict=True) if m]
        assert got == pytest.approx(stored_lp)
        assert all(math.isnan(b) for b, m in zip(s.behaviour, s.mask, strict=True) if not m)
    for s in load_episodes(lake, "run_id = 'expert'", snapshot=snap):
        assert all(math.isnan(b) for b in s.behaviour)  # text policy: no sampling logprobs


def test_filter_and_pinned_snapshot(stored):
    lake, spec = stored
    snap = lake.current_snapshot()
    seqs = load_episodes(lake, "success AND policy_id LIKE 'scripted:%'", snapshot=snap)
    assert len(seqs) == 12 and all(s.success for s in seqs)
    first = lake.query("SELECT min(snapshot_id) AS s FROM ducklake_snapshots('lake') "
                       "WHERE commit_message LIKE '%episodes of run sampled%'")["s"][0]
    assert len(load_episodes(lake, "run_id = 'sampled'", snapshot=first - 1)) == 0


def test_unscored_episodes_are_an_error(stored):
    lake, _ = stored
    from trajlake.rewards import SPECS_DIR, load_spec

    other = load_spec(SPECS_DIR / "goal-and-turns.toml")
    with pytest.raises(TrajlakeError, match="not scored"):
        load_episodes(lake, "true", snapshot=lake.current_snapshot(), spec_id=other.spec_id)


def test_collate_pads_right_and_slices(stored):
    lake, spec = stored
    seqs = load_episodes(lake, "true", snapshot=lake.current_snapshot(), spec_id=spec.spec_id)
    b = collate(seqs, pad_id=0)
    T = max(len(s) for s in seqs)
    assert b.input_ids.shape == (len(seqs), T) and b.loss_mask.shape == (len(seqs), T)
    for i, s in enumerate(seqs):
        n = len(s)
        assert b.input_ids[i, :n].tolist() == s.ids and b.attention_mask[i].sum() == n
        assert b.loss_mask[i, n:].sum() == 0 and b.loss_mask[i, :n].tolist() == s.mask
    sub = b.rows([1, 0])
    assert sub.input_ids.shape[1] == max(len(seqs[0]), len(seqs[1]))
    assert sub.episode_ids == [seqs[1].episode_id, seqs[0].episode_id]
    assert torch.equal(sub.input_ids[0, :len(seqs[1])], b.input_ids[1, :len(seqs[1])])


def test_micro_batches_bucket_by_length():
    rng = random.Random(0)
    lengths = [rng.randrange(10, 500) for _ in range(64)]
    rows = list(range(64))
    bucketed = micro_batches(lengths, rows, 8)
    naive = [rows[k:k + 8] for k in range(0, 64, 8)]
    assert sorted(i for g in bucketed for i in g) == rows
    assert padding_waste(lengths, bucketed) < padding_waste(lengths, naive) / 3
    assert len(micro_batches(lengths, rows[:5], 4, count=3)) == 3
    with pytest.raises(ValueError):
        micro_batches(lengths, rows, 4, count=2)
    parts = [shard(rows, lengths, r, 2) for r in range(2)]
    assert sorted(parts[0] + parts[1]) == rows and abs(len(parts[0]) - len(parts[1])) <= 1
    assert abs(sum(lengths[i] for i in parts[0]) - sum(lengths[i] for i in parts[1])) < 500
