"""The rewards bench's synthetic lake: episodes of a fixed number of turns, every turn with 10-60 prompt and 10-60
response token ids, action texts of which about half match the format pattern, step rewards, info JSON with a
score or none; appended to a lake in a few big Arrow batches (bench/rewards.py; the viewer's bench uses it too).
"""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

ACTIONS = [
    "<think>the key is in the drawer</think>\n<action>open drawer</action>",
    "<action>go north</action>",
    "I will go north now.",
    "<think>hmm</think> take key",
    "<action>take key from drawer</action> done",
    "look around",
]
OBSERVATIONS = ["You are in a kitchen. There is a drawer.", "You see a key.", "Nothing happens.",
                "The door is locked.", "You are in the hall."]
#: the spec the rewards and scale benches recompute over these lakes: every component kind that reads the turns
#: (goal, format, length penalty, env reward, SQL), discounted allocation
SPEC = """
name = "bench"

[allocation]
strategy = "discounted"
gamma = 0.99

[[components]]
kind = "goal"
weight = 1.0

[[components]]
kind = "format"
weight = 0.2
pattern = "<action>.*</action>"

[[components]]
kind = "length_penalty"
weight = 1.0
unit = "tokens"
scope = "last"
max = 40
scale = 0.01

[[components]]
kind = "env_reward"
weight = 0.5
discount = 0.95

[[components]]
kind = "sql"
weight = 0.5
expr = "num_turns * 0.1"
"""

INFOS = ['{"score": 0.25, "valid": true}', '{"valid": true}', '{"valid": false}', '{"score": 0.5}', "{}", None]


def token_lists(rng: np.random.Generator, n: int) -> pa.ListArray:
    lengths = rng.integers(10, 61, n)
    offsets = np.zeros(n + 1, np.int32)
    np.cumsum(lengths, out=offsets[1:])
    values = rng.integers(0, 50_000, int(offsets[-1]), dtype=np.int32)
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(values))


def pick(rng: np.random.Generator, choices: list, n: int, p=None) -> pa.Array:
    return pa.array(choices).take(pa.array(rng.choice(len(choices), n, p=p)))


def synthetic_batch(rng: np.random.Generator, first: int, episodes: int, tpe: int) -> dict[str, pa.Table]:
    ids = pa.array([f"ep{i:08d}" for i in range(first, first + episodes)])
    n = episodes * tpe
    episodes_t = pa.table({
        "episode_id": ids,
        "env": pa.array(["synthetic"] * episodes),
        "status": pick(rng, ["ok", "ok", "ok", "truncated"], episodes),
        "success": pa.array(rng.random(episodes) < 0.4),
        "env_reward": pa.array(np.round(rng.random(episodes), 3)),
        "num_turns": pa.array(np.full(episodes, tpe, np.int32)),
    })
    step = np.where(rng.random(n) < 0.2, np.round(rng.random(n), 2), 0.0)
    turns_t = pa.table({
        "episode_id": ids.take(pa.array(np.repeat(np.arange(episodes), tpe))),
        "turn": pa.array(np.tile(np.arange(tpe, dtype=np.int32), episodes)),
        "observation": pick(rng, OBSERVATIONS, n),
        "action_text": pick(rng, ACTIONS, n),
        "format_ok": pa.array(rng.random(n) < 0.5),
        "step_reward": pa.array(step),
        "done": pa.array(np.tile(np.arange(tpe) == tpe - 1, episodes)),
        "info": pick(rng, INFOS, n),
        "prompt_token_ids": token_lists(rng, n),
        "response_token_ids": token_lists(rng, n),
    })
    return {"episodes": episodes_t, "turns": turns_t}


def build_lake(lake, args) -> tuple[int, int]:
    rng = np.random.default_rng(args.seed)
    n_episodes = args.turns // args.turns_per_episode
    per_batch = math.ceil(n_episodes / args.batches)
    tokens = 0
    for first in range(0, n_episodes, per_batch):
        batch = synthetic_batch(rng, first, min(per_batch, n_episodes - first), args.turns_per_episode)
        tokens += sum(pc.sum(pc.list_value_length(batch["turns"][c])).as_py()
                      for c in ("prompt_token_ids", "response_token_ids"))
        lake.append(batch, stage="bench", message="bench: synthetic episodes")
    return n_episodes, tokens

