"""The store bench's synthetic episodes and turns (deterministic for a seed), already in the store's exact schema
(`store.validate.conform` of the `episodes` and `turns` tables): every turn has 100-800 new prompt token ids and
10-60 response token ids with as many logprobs (ids drawn from a Zipf-like law over a 151,936-id vocabulary, so
they compress about as real ones do), an observation, a reply text, an action, step reward, info JSON and latency.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

VOCAB = 151_936  # Qwen2's vocabulary size
PROMPT_TOKENS = (100, 800)  # new prompt ids per turn, inclusive
RESPONSE_TOKENS = (10, 60)


def token_pool(rng: np.random.Generator, n: int = 1 << 22) -> np.ndarray:
    """`n` token ids drawn from a Zipf-like law over the vocabulary (id k about as frequent as 1 / (k + 10)):
    each turn's ids are picked from this pool, which is much faster than drawing each from the law."""
    ranks = np.arange(VOCAB, dtype=np.float64)
    cdf = np.cumsum(1.0 / (ranks + 10.0))
    return np.searchsorted(cdf / cdf[-1], rng.random(n)).astype(np.int32)


def text_pool(rng: np.random.Generator, n: int, low: int, high: int, words: list[str]) -> list[str]:
    return [" ".join(rng.choice(words, int(rng.integers(low, high + 1)))) for _ in range(n)]


WORDS = ("you are in the kitchen hall garden there is a drawer door key box table north south east west "
         "take open close go look inventory craft wood plank stick stone iron nothing happens locked").split()


def id_lists(rng: np.random.Generator, pool: np.ndarray, lengths: np.ndarray) -> pa.ListArray:
    offsets = np.zeros(len(lengths) + 1, np.int32)
    np.cumsum(lengths, out=offsets[1:])
    values = pool[rng.integers(0, len(pool), int(offsets[-1]), dtype=np.int32)]
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(values))


def episode_ids(rng: np.random.Generator, n: int) -> pa.Array:
    """Random UUID-shaped ids, as collect's (uuid5 of run, task and sample): no order to prune a key lookup by."""
    digits = np.frombuffer(b"0123456789abcdef", np.uint8)[rng.integers(0, 16, (n, 36), dtype=np.uint8)]
    digits[:, [8, 13, 18, 23]] = ord("-")
    return pa.array(digits.view("S36").ravel().astype(str))


def synthetic_batch(rng, pools: dict, first_episode: int, episodes: int, tpe: int) -> dict[str, pa.Table]:
    """`episodes` episodes of `tpe` turns each, as the store's exact `episodes` and `turns` schemas."""
    from trajlake.schemas.tables import TABLES
    from trajlake.store.validate import conform

    n = episodes * tpe
    ids = episode_ids(rng, episodes)
    row_episode = np.repeat(np.arange(episodes), tpe)
    prompt_len = rng.integers(PROMPT_TOKENS[0], PROMPT_TOKENS[1] + 1, n)
    response_len = rng.integers(RESPONSE_TOKENS[0], RESPONSE_TOKENS[1] + 1, n)
    response = id_lists(rng, pools["tokens"], response_len)
    logprobs = pa.ListArray.from_arrays(response.offsets, pa.array(
        -rng.exponential(0.4, len(response.values)).astype(np.float32)))
    pick = lambda name, k: pa.array(pools[name]).take(pa.array(rng.integers(0, len(pools[name]), k)))  # noqa: E731
    success = rng.random(episodes) < 0.4
    t0 = datetime(2026, 11, 23, tzinfo=timezone.utc) + timedelta(seconds=first_episode)
    started = pa.array([t0 + timedelta(seconds=i) for i in range(episodes)], pa.timestamp("us", tz="UTC"))
    episodes_t = pa.table({
        "episode_id": ids,
        "run_id": pa.array(["bench-store"] * episodes),
        "policy_id": pa.array(["bench-policy"] * episodes),
        "task_id": pa.array([f"task-{i // 8:08d}" for i in range(first_episode, first_episode + episodes)]),
        "env": pa.array(["synthetic"] * episodes),
        "group_id": pa.array([f"group-{i // 8:08d}" for i in range(first_episode, first_episode + episodes)]),
        "sample_index": pa.array(np.arange(first_episode, first_episode + episodes, dtype=np.int32) % 8),
        "status": pa.array(np.where(success, "success", "failure")),
        "success": pa.array(success),
        "env_reward": pa.array(np.where(success, 1.0, np.round(rng.random(episodes), 3))),
        "num_turns": pa.array(np.full(episodes, tpe, np.int32)),
        "num_agent_tokens": pa.array(np.add.reduceat(response_len, np.arange(0, n, tpe)).astype(np.int32)),
        "started_at": started,
        "finished_at": pc.add(started, pa.scalar(timedelta(seconds=30))),
    })
    last = np.tile(np.arange(tpe) == tpe - 1, episodes)
    turns_t = pa.table({
        "episode_id": ids.take(pa.array(row_episode)),
        "turn": pa.array(np.tile(np.arange(tpe, dtype=np.int32), episodes)),
        # an observation names its episode and turn, so (as in real runs) almost none repeats
        "observation": pc.binary_join_element_wise(
            pick("observations", n), ids.take(pa.array(row_episode)),
            pc.cast(pa.array(np.tile(np.arange(tpe), episodes)), pa.string()), " | "),
        "action_text": pick("replies", n),
        "action": pick("actions", n),
        "format_ok": pa.array(rng.random(n) < 0.8),
        "step_reward": pa.array(np.where(last, success[row_episode].astype(np.float64), 0.0)),
        "done": pa.array(last),
        "info": pick("infos", n),
        "prompt_token_ids": id_lists(rng, pools["tokens"], prompt_len),
        "response_token_ids": response,
        "response_logprobs": logprobs,
        "latency_ms": pa.array(np.round(rng.gamma(2.0, 40.0, n), 2)),
    })
    return {"episodes": conform(episodes_t, TABLES["episodes"]), "turns": conform(turns_t, TABLES["turns"])}


def make_batches(cfg) -> list[dict[str, pa.Table]]:
    rng = np.random.default_rng(cfg.seed)
    words = list(WORDS)
    pools = {
        "tokens": token_pool(rng),
        "observations": text_pool(rng, 2000, 20, 120, words),
        "replies": ["<think>" + t + "</think><action>" + a + "</action>" for t, a in
                    zip(text_pool(rng, 500, 5, 30, words), text_pool(rng, 500, 2, 5, words), strict=True)],
        "actions": text_pool(rng, 200, 2, 5, words),
        "infos": ['{"valid": true}', '{"valid": false}', '{"score": 0.25, "valid": true}', "{}"],
    }
    n_episodes = -(-cfg.turns // cfg.turns_per_episode)
    batches = []
    for first in range(0, n_episodes, cfg.episodes_per_batch):
        k = min(cfg.episodes_per_batch, n_episodes - first)
        batch = synthetic_batch(rng, pools, first, k, cfg.turns_per_episode)
        extra = (first + k) * cfg.turns_per_episode - cfg.turns  # the last episode may be cut short
        if extra > 0:
            batch = cut_last_episode(batch, extra)
        batches.append(batch)
    return batches


def cut_last_episode(batch: dict[str, pa.Table], extra: int) -> dict[str, pa.Table]:
    """Drop the last `extra` turns (all of the last episode's), so exactly --turns turns are written."""
    from trajlake.schemas.tables import TABLES
    from trajlake.store.validate import conform

    turns = batch["turns"].slice(0, batch["turns"].num_rows - extra)
    last = batch["episodes"].num_rows - 1
    kept = turns.num_rows - pc.sum(pc.equal(turns["episode_id"], batch["episodes"]["episode_id"][last])).as_py()
    n_last = turns.num_rows - kept
    episodes = batch["episodes"]
    cols = {name: episodes[name] for name in episodes.column_names}
    cols["num_turns"] = pa.array(np.append(episodes["num_turns"].to_numpy()[:-1], n_last).astype(np.int32))
    cols["num_agent_tokens"] = pa.array(np.append(
        episodes["num_agent_tokens"].to_numpy()[:-1],
        pc.sum(turns["num_response_tokens"].slice(kept)).as_py() or 0).astype(np.int32))
    return {"episodes": conform(pa.table(cols), TABLES["episodes"]), "turns": turns}
