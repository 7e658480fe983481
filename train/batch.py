"""Training batches read from the store: exact token sequences, loss masks, per-token rewards, groups.

`load_episodes(lake, where, snapshot, spec_id)` reads, at a pinned snapshot, every episode matching a SQL
filter over episodes columns (store.reads.training_turns: never those that ended in an env error, status
`error`: a dead env server cut them short, so their outcome and reward say nothing about the policy; a resumed
collect run replays them under new ids, and a GRPO group then holds the replays, not the failed attempts) and
rebuilds its full token sequence from the stored ids (prompt + response ids per turn, in turn order; nothing is
re-tokenized). The loss mask is 1 exactly on response ids. Rewards come from the `reward_spans` view of a spec
(runs of equal per-token rewards; positions index the full sequence; `token_rewards` is its expansion, one row
per token), behaviour log-probs are placed at the positions of the tokens they were sampled for (NaN where the
policy gave none).

`collate(seqs)` right-pads sequences into (B, T) tensors; `micro_batches(lengths, rows, size)` groups rows
by length so a micro-batch pads little.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from trajlake.core.errors import TrajlakeError
from trajlake.store import Lake, reads
from trajlake.train.turn_structure import step_keys_from_observations, turn_index_from_lengths


@dataclass
class EpisodeSeq:
    """One episode as a training sequence (lists of length T, the episode's full token count)."""

    episode_id: str
    group_id: str
    success: bool
    ids: list[int]
    mask: list[int]
    behaviour: list[float]  # log-prob the sampler gave each response token; NaN on prompt tokens or unknown
    rewards: list[float] = field(default_factory=list)  # per-token rewards (0 where none)
    score: float = 0.0  # the episode's total reward under the spec
    turn_lengths: list[tuple[int, int]] = field(default_factory=list)  # (prompt ids, response ids) per turn
    observations: list[str | None] = field(default_factory=list)  # the observation each turn answered

    def __len__(self) -> int:
        return len(self.ids)


def check_episode_filter(lake: Lake, where: str, *, field: str, snapshot: int | None = None) -> int:
    """How many episodes (never those that ended in an env error) the filter `where` of a config's `field`
    matches at `snapshot` (store.reads.check_episode_filter). Raises ConfigError naming `field`, reading nothing
    else, when `where` is not one SQL expression over episodes columns."""
    from trajlake.train.config import ConfigError

    what = f"train config: {field}" if field.isidentifier() else field  # a config field, or a command's option
    try:
        return reads.check_episode_filter(lake, where, what=what, snapshot=snapshot)
    except reads.EpisodeFilterError as e:
        raise ConfigError(str(e)) from None


def load_episodes(lake: Lake, where: str, *, snapshot: int, spec_id: str | None = None) -> list[EpisodeSeq]:
    """Episodes matching `where` (SQL over episodes columns) at `snapshot`, in episode_id order, never those
    that ended in an env error (status `error`), whatever `where` says.

    With `spec_id`, every episode must have been scored by that spec (its token rewards and total are
    filled in); episodes without any response token are left out (nothing to train on).
    """
    rows = reads.training_turns(lake, where, snapshot=snapshot, spec_id=spec_id).to_pylist()
    seqs: dict[str, EpisodeSeq] = {}
    scored: dict[str, dict] = {}
    for r in rows:
        s = seqs.get(r["episode_id"])
        if s is None:
            s = seqs[r["episode_id"]] = EpisodeSeq(r["episode_id"], r["group_id"] or r["episode_id"],
                                                   bool(r["success"]), [], [], [])
            if spec_id is not None:
                scored[s.episode_id] = r
        p, a = list(r["prompt_token_ids"] or ()), list(r["response_token_ids"] or ())
        lp = r["response_logprobs"]
        if lp is not None and len(lp) != len(a):
            raise TrajlakeError(f"episode {s.episode_id} turn {r['turn']}: {len(lp)} logprobs for {len(a)} tokens")
        s.ids += p + a
        s.mask += [0] * len(p) + [1] * len(a)
        s.turn_lengths.append((len(p), len(a)))
        s.observations.append(r["observation"])
        s.behaviour += [math.nan] * len(p) + ([math.nan if x is None else float(x) for x in lp] if lp is not None
                                               else [math.nan] * len(a))
    out = [s for s in seqs.values() if any(s.mask)]
    if spec_id is not None and out:
        _attach_rewards(scored, snapshot, spec_id, out)
    return out


def _attach_rewards(scored: dict[str, dict], snapshot: int, spec_id: str, seqs: list[EpisodeSeq]) -> None:
    """Fill in each sequence's total and token rewards from its first row of `training_turns` with a spec."""
    missing = [s.episode_id for s in seqs if not scored[s.episode_id]["scored"]]
    if missing:
        raise TrajlakeError(f"{len(missing)} episodes (e.g. {missing[0]}) are not scored by spec {spec_id} at "
                            f"snapshot {snapshot}: score them first (trajlake rewards)")
    for s in seqs:
        r = scored[s.episode_id]
        s.rewards = [0.0] * len(s.ids)
        s.score = float(r["total"])
        for pos, length, reward in zip(r["positions"] or (), r["lengths"] or (), r["rewards"] or (), strict=True):
            pos, end = int(pos), int(pos) + int(length)
            if not 0 <= pos < end <= len(s.ids):
                raise TrajlakeError(f"episode {s.episode_id}: token rewards at positions {pos}..{end - 1} outside "
                                    f"its {len(s.ids)} tokens")
            reward = float(reward)
            s.rewards[pos:end] = [x + reward for x in s.rewards[pos:end]]


@dataclass
class Batch:
    """Right-padded tensors of B sequences, all (B, T) unless said otherwise.

    input_ids (long), attention_mask (long, 1 on real tokens), loss_mask (float, 1 on response tokens),
    token_rewards (float), behaviour_logprobs (float, NaN where unknown), scores (B,), success (B,),
    group_ids (list of B str), episode_ids (list of B str); the turn structure the turn-level advantage
    estimators read (train.algos.turns): turn_index (long, each response token's turn, -1 elsewhere) and
    step_keys (B, K) long (an id of the observation each turn answered, -1 for none).
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    loss_mask: torch.Tensor
    token_rewards: torch.Tensor
    behaviour_logprobs: torch.Tensor
    scores: torch.Tensor
    success: torch.Tensor
    group_ids: list[str]
    episode_ids: list[str]
    turn_index: torch.Tensor | None = None
    step_keys: torch.Tensor | None = None

    @property
    def size(self) -> int:
        return self.input_ids.shape[0]

    @property
    def lengths(self) -> list[int]:
        return self.attention_mask.sum(-1).tolist()

    def rows(self, idx: list[int], width: int | None = None) -> Batch:
        """The sub-batch of rows `idx`, cut to `width` columns (default: their longest sequence)."""
        t = torch.as_tensor(idx, dtype=torch.long)
        w = width if width is not None else (int(self.attention_mask[t].sum(-1).max()) if idx else 0)

        def cut(x):
            return x[t, :w]

        return Batch(cut(self.input_ids), cut(self.attention_mask), cut(self.loss_mask), cut(self.token_rewards),
                     cut(self.behaviour_logprobs), self.scores[t], self.success[t],
                     [self.group_ids[i] for i in idx], [self.episode_ids[i] for i in idx],
                     None if self.turn_index is None else cut(self.turn_index),
                     None if self.step_keys is None else self.step_keys[t])


def collate(seqs: list[EpisodeSeq], pad_id: int = 0) -> Batch:
    """Right-pad `seqs` to their longest length: a Batch of (B, T) tensors."""
    B, T = len(seqs), max((len(s) for s in seqs), default=0)
    ids = torch.full((B, T), pad_id, dtype=torch.long)
    attn = torch.zeros((B, T), dtype=torch.long)
    mask = torch.zeros((B, T), dtype=torch.float32)
    rew = torch.zeros((B, T), dtype=torch.float32)
    beh = torch.full((B, T), math.nan, dtype=torch.float32)
    for i, s in enumerate(seqs):
        n = len(s)
        ids[i, :n] = torch.tensor(s.ids, dtype=torch.long)
        attn[i, :n] = 1
        mask[i, :n] = torch.tensor(s.mask, dtype=torch.float32)
        if s.rewards:
            rew[i, :n] = torch.tensor(s.rewards, dtype=torch.float32)
        beh[i, :n] = torch.tensor(s.behaviour, dtype=torch.float32)
    turn_index = step_keys = None
    if seqs and all(s.turn_lengths for s in seqs):  # sequences read from the store know their turns
        turn_index = turn_index_from_lengths([[p for p, _ in s.turn_lengths] for s in seqs],
                                             [[a for _, a in s.turn_lengths] for s in seqs], width=T)
        step_keys = step_keys_from_observations([s.observations for s in seqs])
    return Batch(ids, attn, mask, rew, beh,
                 torch.tensor([s.score for s in seqs], dtype=torch.float64),
                 torch.tensor([s.success for s in seqs], dtype=torch.bool),
                 [s.group_id for s in seqs], [s.episode_id for s in seqs], turn_index, step_keys)


def micro_batches(lengths: list[int], rows: list[int], size: int, count: int | None = None,
                  keys: list[str] | None = None) -> list[list[int]]:
    """Split `rows` into micro-batches of at most `size` rows, grouped by length (longest first), so each
    pads to a length close to its rows' own. With `keys` (a key per row, e.g. group ids), rows of a key are
    kept together (keys longest first, then by length within a key), so a micro-batch holds rows that share
    a prompt. With `count`, exactly `count` micro-batches (trailing ones may be empty lists), so every
    process runs as many as the others."""
    if keys is None:
        order = sorted(rows, key=lambda i: (-lengths[i], i))
    else:
        longest: dict[str, int] = {}
        for i in rows:
            longest[keys[i]] = max(longest.get(keys[i], 0), lengths[i])
        order = sorted(rows, key=lambda i: (-longest[keys[i]], keys[i], -lengths[i], i))
    out = [order[k:k + size] for k in range(0, len(order), size)]
    if count is not None:
        if len(out) > count:
            raise ValueError(f"{len(rows)} rows do not fit {count} micro-batches of {size}")
        out += [[] for _ in range(count - len(out))]
    return out


def shard(rows: list[int], lengths: list[int], rank: int, world: int) -> list[int]:
    """This process's share of a mini-batch: rows sorted by length, dealt round robin (balanced lengths)."""
    order = sorted(rows, key=lambda i: (-lengths[i], i))
    return order[rank::world]


def padding_waste(lengths: list[int], groups: list[list[int]]) -> float:
    """Share of padded positions over micro-batches `groups` (0: none)."""
    real = sum(lengths[i] for g in groups for i in g)
    padded = sum(len(g) * max(lengths[i] for i in g) for g in groups if g)
    return 1 - real / padded if padded else 0.0
