"""Turn-level credit assignment for multi-turn episodes: GiGPO, per-turn discounted returns, turn-level GAE.

The token-level estimators of :mod:`trajlake.train.algos.advantages` give every agent token of an episode credit from
one sequence of token rewards. The estimators here work on **turns** (one observation -> one reply -> one env
step): each turn gets one advantage, broadcast to its agent tokens. They register in the same
:data:`~trajlake.train.algos.ADVANTAGES` registry (``gigpo``, ``turn_reinforce``, ``turn_gae``), take the same
keyword-only arguments as the token-level ones plus the turn structure below (each accepts every turn input,
so one kwargs dict serves all three; knobs of one estimator, e.g. ``baseline``, are refused by the others),
and return ``(advantages, returns)``, both (B, T), zero outside the mask, detached (no gradient ever flows
through them). Everything is computed in float64 and returned in the inputs' floating dtype (>= float32).

Inputs (B episodes, one per row, padded to T tokens; K = the number of turn slots):

- ``mask`` (B, T): 1 on agent tokens (the ids the policy sampled), 0 on prompt/observation/padding tokens.
- ``turn_index`` (B, T) integer: the turn number (0-based, the store's ``turns.turn``) of each agent token.
  Read only where ``mask`` is 1 (anything, e.g. -1, elsewhere); must be >= 0 there. Build it with
  :func:`turn_index_from_lengths` (from the stored turns' token counts; exact, keeps the store's turn numbers
  even when a reply is empty) or :func:`turn_index_from_mask` (each maximal run of agent tokens is one turn;
  right whenever every turn has a non-empty reply and every later turn a non-empty prompt).
- ``turn_rewards`` (B, K) float, optional: each turn's reward (e.g. its process rewards, plus the outcome on
  the episode's last turn). Default: the sum of ``token_level_rewards`` over each turn's agent tokens, which
  is exactly that with the ``per_turn`` allocation (process rewards on each turn's last agent token, the
  outcome on the episode's last agent token) and puts the whole reward on the last turn with ``last_token``.
  Do not combine these estimators with the ``discounted`` allocation: ``gamma`` here already discounts
  across turns.
- ``turn_mask`` (B, K), optional: 1 on the turns that exist. Default: the turns with at least one agent
  token. Turns outside it are skipped entirely (they neither carry nor break a discounted sum, as masked
  tokens are skipped by the token-level estimators; rewards, values and keys stored there are ignored). A
  turn with agent tokens must be in it. Pass it to count turns without agent tokens.
- ``step_keys`` (``gigpo`` only): the anchor state of each turn, per row and turn: a (B, >= K) integer tensor
  or array (negative = unknown), or B sequences of hashables (e.g. the observation texts; None = unknown; a
  row needs an entry for each of its turns). Build ints with :func:`step_keys_from_observations`.
- ``turn_values`` (B, K) (``turn_gae`` only, optional): the critic's value of the state each turn starts
  from, instead of reading ``values`` (B, T) at each turn's first agent token.
- ``group_ids`` (B,): the group (task) of each episode, as for ``grpo``.

Building them from the store (train/batch.py lays a row out as, for each turn in ``turns.turn`` order, its
``prompt_token_ids`` then its ``response_token_ids``; the mask is 1 on the latter):

- ``turn_index = turn_index_from_lengths(num_prompt_tokens per turn, num_response_tokens per turn, width=T)``
  (the turns table's lengths columns, in turn order; the k-th listed turn gets k).
- ``step_keys = step_keys_from_observations(observation per turn)``: ``turns.observation`` is the
  observation the turn's reply answered (collect/rollout.py stores the pre-step observation), the anchor
  state GiGPO groups by.
- ``turn_rewards``: nothing to do when the spec allocates ``per_turn`` (or ``last_token`` for an outcome-only
  spec): the default reads them off the token rewards. Otherwise, for spec S: ``turn_rewards[b, k]`` = the
  ``turn_rewards`` table's reward for (S, episode b, turn k) (0 where it has no row), plus
  ``episode_rewards.total - sum of those`` (the outcome part) on the episode's last turn with agent tokens:
  the split the ``per_turn`` allocation makes.
- ``values`` (B, T): the critic's per-token values as for ``gae`` (trajlake's ValueModel aligns them so
  the value at a turn's first agent token is that of the state after its whole prompt).

Each estimator's registry entry (:class:`~trajlake.train.algos.core.Advantage`) names, in ``turn_inputs``, the
turn-structure inputs it requires beyond the token-level ones, so a trainer builds them only when the
configured estimator needs them, and in ``params`` its own settings' TrainConfig fields::

    estimator = ADVANTAGES[name]
    kw = dict(token_level_rewards=..., mask=..., values=..., group_ids=..., gamma=..., lam=..., ...)
    if "turn_index" in estimator.turn_inputs:
        kw["turn_index"] = turn_index_from_lengths(prompt_lengths, response_lengths, width=T)
    if "step_keys" in estimator.turn_inputs:
        kw["step_keys"] = step_keys_from_observations(observations)
    adv, ret = estimator(**kw, **estimator.settings(config))

An estimator called without an input it needs raises ``ValueError`` naming each missing one.

Group statistics (used by ``gigpo`` and by ``turn_reinforce`` with a baseline) follow ``grpo``: the mean and
the unbiased (Bessel) std of the population; ``(x - mean) / (std + eps)`` when normalising by the std; a
population of equal values (a singleton included) has exactly that value as its mean and std 0, and a
difference is never divided by a std of 0 (so a member of such a population gets exactly 0).

GiGPO (Feng et al. 2025, arXiv:2505.10978), written afresh from verl-agent's ``gigpo/core_gigpo.py``
(compute_gigpo_outcome_advantage, episode_norm_reward, build_step_group, step_norm_reward,
compute_step_discounted_returns) and the trainer call, episode reward manager and config around it.
Followed: the episode advantage normalises the episode return (there: the sum of the env's step rewards, put
on every step row) within the group; a step group is the set of steps of one group's trajectories whose
anchor observations are equal, whatever their step number, a state revisited within one trajectory
included; a step's value is its discounted return of per-step rewards (gamma = the algorithm's gamma, 0.95
in verl-agent's examples); the step advantage is normalised within its step group; the final advantage is
``episode + step_advantage_w * step`` (here ``step_advantage_weight``, default 1) and returns = advantages;
verl-agent's ``mode`` ``mean_std_norm`` (its config default) / ``mean_norm`` is ``norm_by_std`` True /
False here, for both levels; torch.std's unbiased std; eps 1e-6. Different:

- A batch row here is a whole episode, not one step: the step advantage of turn k goes to turn k's agent
  tokens within the episode's row.
- A group of one episode gets 0 (as trajlake's grpo); verl-agent uses mean 0 and std 1 there, so the
  advantage is the return itself.
- Episode-level statistics are over the group's episodes by default (the paper's Eq. 3); verl-agent by
  default (``compute_mean_std_cross_steps=True``) takes them over the group's step rows, so an episode
  weighs as many times as it has steps: ``episode_stats="turns"`` does that.
- Unknown anchors (None / negative ids) are step groups of one rather than one group; there is no
  similarity-based grouping (verl-agent's ``enable_similarity``, a difflib ratio threshold): keys match exactly.
"""


from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any

import torch

from trajlake.train.algos.core import masked_whiten, register_advantage
from trajlake.train.algos.turn_math import (
    TURN_INDEX_WHAT,
    _center,
    _discounted_returns,
    _first_positions,
    _groups,
    _missing,
    _segment_stats,
    _turns,
    turn_first_positions,
)
from trajlake.train.turn_structure import (  # the inputs' builders, re-exported: one place to import from
    observation_key,
    step_keys_from_observations,
    turn_index_from_lengths,
    turn_index_from_mask,
)

__all__ = [
    "compute_gigpo", "compute_turn_reinforce", "compute_turn_gae",
    "turn_index_from_mask", "turn_index_from_lengths", "turn_first_positions", "observation_key",
    "step_keys_from_observations", "TURN_BASELINES", "EPISODE_STATS",
]

#: ``turn_reinforce``'s baselines: none, the group's mean return at the same turn, the group's mean episode return.
TURN_BASELINES = ("none", "turn", "episode")

#: ``gigpo``'s episode-level statistics: over the group's episodes (the paper), or over its turns (verl-agent).
EPISODE_STATS = ("episodes", "turns")



# ---------------------------------------------------------------------------------------------------- GiGPO


class _Unknown:
    """A key equal only to itself: an unknown anchor state forms a step group of its own."""

    __slots__ = ()


def _step_group_ids(step_keys, valid: torch.Tensor, groups: torch.Tensor, name: str) -> torch.Tensor:
    """Dense step-group ids (N,) of the valid turns, in ``valid.nonzero()`` order: turns of the same
    episode group whose anchor key is equal share an id; an unknown key (None, or < 0 in an integer
    tensor) is a group of its own."""
    cells = valid.nonzero().tolist()
    kind = getattr(getattr(step_keys, "dtype", None), "kind", None)  # numpy: "i"/"u" for integers
    as_ints = isinstance(step_keys, torch.Tensor) or kind in ("i", "u", "f", "b")
    if as_ints:
        keys = torch.as_tensor(step_keys)
        if keys.dim() != 2 or keys.shape[0] != valid.shape[0] or keys.is_floating_point():
            raise ValueError(f"{name}: step_keys must be an integer (B, K) tensor with B = {valid.shape[0]}, got "
                             f"{keys.dtype} {tuple(keys.shape)}")
        need = max((k for _, k in cells), default=-1) + 1
        if keys.shape[1] < need:
            raise ValueError(f"{name}: step_keys has {keys.shape[1]} columns but turn {need - 1} is in use")
        rows = keys.tolist()
    else:
        rows = step_keys
        if len(rows) != valid.shape[0]:
            raise ValueError(f"{name}: step_keys has {len(rows)} rows for a batch of {valid.shape[0]}")
    g = groups.tolist()
    ids: dict[tuple[int, Hashable], int] = {}
    out = []
    for b, k in cells:
        try:
            key = rows[b][k]
        except IndexError:
            raise ValueError(f"{name}: step_keys row {b} has {len(rows[b])} keys, but its turn {k} is in use") from None
        if (key < 0) if as_ints else (key is None):
            key = _Unknown()
        elif isinstance(key, list):
            key = tuple(key)
        out.append(ids.setdefault((g[b], key), len(ids)))
    return torch.tensor(out, dtype=torch.long, device=valid.device)


@register_advantage("gigpo", group_relative=True, turn_inputs=("turn_index", "step_keys"),
                    params={"step_advantage_weight": "step_advantage_weight"})
@torch.no_grad()
def compute_gigpo(*, token_level_rewards: torch.Tensor, mask: torch.Tensor, values: torch.Tensor | None = None,
                  group_ids: Sequence[Hashable] | torch.Tensor | None = None, scores: torch.Tensor | None = None,
                  gamma: float = 1.0, lam: float = 1.0, eps: float = 1e-6, whiten: bool = False,
                  norm_by_std: bool = True, turn_index: torch.Tensor | None = None, step_keys: Any = None,
                  turn_rewards: torch.Tensor | None = None, turn_mask: torch.Tensor | None = None,
                  turn_values: torch.Tensor | None = None, step_advantage_weight: float = 1.0,
                  episode_stats: str = "episodes") -> tuple[torch.Tensor, torch.Tensor]:
    """GiGPO (Feng et al. 2025, "Group-in-Group Policy Optimization for LLM Agent Training"): episode-level
    GRPO plus a step-level advantage among the turns of a group that answered the same observation.

    Reads: ``mask``, ``turn_index`` (B, T), ``step_keys`` (anchor state per row and turn), ``group_ids`` (B,)
    (all required), ``turn_rewards`` / ``turn_mask`` (B, K) (optional; default from ``token_level_rewards``,
    see the module doc), ``scores`` (B,) (optional episode returns), ``gamma``, ``eps``, ``norm_by_std``,
    ``step_advantage_weight``, ``episode_stats``. Ignores values, turn_values, lam, whiten.

    - Episode level: R_i = ``scores[i]`` or the sum of episode i's turn rewards (undiscounted); within each
      group, ``A_E(i) = (R_i - mean) / (std + eps)`` (``R_i - mean`` when not ``norm_by_std``).
      ``episode_stats="episodes"``: the statistics are over the group's episodes (the paper's Eq. 3);
      ``"turns"``: each episode counts once per turn (verl-agent's default, compute_mean_std_cross_steps).
    - Step level: the valid turns of one group's episodes whose ``step_keys`` are equal form a step group
      (turns at any turn number, of several episodes or repeated in one; an unknown key is a group of one).
      Each turn's value is its discounted return ``G_k = sum_{j >= k} gamma^(j-k) r_j`` over the episode's
      valid turns; ``A_S(i, k) = (G_k - mean) / (std + eps)`` within its step group (or ``G_k - mean``).
    - Each agent token of turn k of episode i gets ``A_E(i) + step_advantage_weight * A_S(i, k)``.

    A group (or step group) of one, or of equal values, contributes exactly 0. Returns ``(advantages,
    returns)``, (B, T), zero outside the mask; returns = advantages (no critic).
    """
    _missing("gigpo", turn_index=(turn_index, TURN_INDEX_WHAT),
             step_keys=(step_keys, "per row and turn, the id of the observation the turn answered, "
                                   "e.g. step_keys_from_observations"),
             group_ids=(group_ids, "(B,): the group, e.g. task, of each episode"))
    if episode_stats not in EPISODE_STATS:
        raise ValueError(f"gigpo: unknown episode_stats {episode_stats!r}; valid: {', '.join(EPISODE_STATS)}")
    tr = _turns("gigpo", token_level_rewards, mask, turn_index, turn_rewards, turn_mask)
    B, dev = tr.m.shape[0], tr.m.device
    groups = _groups(group_ids, B, dev, "gigpo")
    if scores is not None:
        R = torch.as_tensor(scores, device=dev).detach().to(torch.float64)
        if R.shape != (B,):
            raise ValueError(f"gigpo: scores must have shape (B,) = ({B},), got {tuple(R.shape)}")
    else:
        R = tr.r.sum(-1)
    weight = tr.valid.sum(-1) if episode_stats == "turns" else None
    mean, std = _segment_stats(R, groups, weight)
    a_episode = _center(R, mean, std, norm_by_std, eps)  # (B,)

    G = _discounted_returns(tr.r, tr.valid, gamma)
    seg = _step_group_ids(step_keys, tr.valid, groups, "gigpo")
    x = G[tr.valid]
    s_mean, s_std = _segment_stats(x, seg)
    a_step = torch.zeros_like(G)
    a_step[tr.valid] = _center(x, s_mean, s_std, norm_by_std, eps)

    adv = tr.broadcast(a_episode.unsqueeze(-1) + step_advantage_weight * a_step)
    return adv, adv.clone()


# ------------------------------------------------------------------------------- per-turn discounted returns


@register_advantage("turn_reinforce", turn_inputs=("turn_index",), params={"baseline": "turn_baseline"})
@torch.no_grad()
def compute_turn_reinforce(*, token_level_rewards: torch.Tensor, mask: torch.Tensor,
                           values: torch.Tensor | None = None,
                           group_ids: Sequence[Hashable] | torch.Tensor | None = None,
                           scores: torch.Tensor | None = None, gamma: float = 1.0, lam: float = 1.0,
                           eps: float = 1e-6, whiten: bool = False, norm_by_std: bool = True,
                           turn_index: torch.Tensor | None = None, turn_rewards: torch.Tensor | None = None,
                           turn_mask: torch.Tensor | None = None, step_keys: Any = None,
                           turn_values: torch.Tensor | None = None,
                           baseline: str = "none") -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE with per-turn rewards: each turn's tokens get the discounted return from that turn on.

    Reads: ``mask``, ``turn_index`` (B, T) (required), ``turn_rewards`` / ``turn_mask`` (B, K) (optional;
    default from ``token_level_rewards``), ``gamma``, ``baseline``, ``group_ids`` (B,) (required with a
    baseline), ``norm_by_std``, ``eps``, ``whiten``. Ignores values, turn_values, step_keys, scores, lam.

    ``G_k = r_k + gamma * G_{k'}`` over each episode's valid turns in order (k' the next valid turn).
    ``baseline``: ``"none"``: A_k = G_k. ``"turn"``: A_k = G_k minus the mean of G at turn number k over
    the group's episodes that have a turn k (divided by that population's std + eps with ``norm_by_std``).
    ``"episode"``: A_k = G_k minus the mean of the group's episode returns (each episode's G at its first
    valid turn; with gamma = 1 and only an outcome reward every G_k is the episode return and this is GRPO),
    divided by their std + eps with ``norm_by_std``. ``norm_by_std`` is ignored without a baseline. Then, with
    ``whiten``, the advantages are whitened over all agent tokens of the batch (as REINFORCE++).
    Returns ``(advantages, returns)``, (B, T), zero outside the mask; returns = G on each turn's tokens.
    """
    if baseline not in TURN_BASELINES:
        raise ValueError(f"turn_reinforce: unknown baseline {baseline!r}; valid: {', '.join(TURN_BASELINES)}")
    _missing("turn_reinforce", turn_index=(turn_index, TURN_INDEX_WHAT),
             group_ids=(group_ids if baseline != "none" else (), f"(B,) for baseline {baseline!r}"))
    tr = _turns("turn_reinforce", token_level_rewards, mask, turn_index, turn_rewards, turn_mask)
    G = _discounted_returns(tr.r, tr.valid, gamma)
    A = G
    if baseline != "none":
        B, K = G.shape
        groups = _groups(group_ids, B, tr.m.device, "turn_reinforce")
        A = torch.zeros_like(G)
        if baseline == "turn":
            cells = tr.valid.nonzero()
            seg = groups[cells[:, 0]] * K + cells[:, 1]
            x = G[tr.valid]
            mean, std = _segment_stats(x, torch.unique(seg, return_inverse=True)[1])
            A[tr.valid] = _center(x, mean, std, norm_by_std, eps)
        else:
            has = tr.valid.any(-1)
            first = torch.gather(G, 1, tr.valid.long().argmax(-1, keepdim=True)).squeeze(-1)  # G at first valid turn
            mean, std = _segment_stats(first, groups, has.long())
            A = torch.where(tr.valid, _center(G, mean.unsqueeze(-1), std.unsqueeze(-1), norm_by_std, eps), A)
    adv = tr.broadcast(A)
    if whiten:
        adv = masked_whiten(adv, tr.m)
    return adv, tr.broadcast(G)


# ------------------------------------------------------------------------------------------ turn-level GAE


@register_advantage("turn_gae", needs_critic=True, turn_inputs=("turn_index",))
@torch.no_grad()
def compute_turn_gae(*, token_level_rewards: torch.Tensor, mask: torch.Tensor, values: torch.Tensor | None = None,
                     group_ids: Sequence[Hashable] | torch.Tensor | None = None, scores: torch.Tensor | None = None,
                     gamma: float = 1.0, lam: float = 1.0, eps: float = 1e-6, whiten: bool = False,
                     norm_by_std: bool = True, turn_index: torch.Tensor | None = None,
                     turn_rewards: torch.Tensor | None = None, turn_mask: torch.Tensor | None = None,
                     step_keys: Any = None,
                     turn_values: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE over turns (PPO with a critic, one value per turn boundary).

    Reads: ``mask``, ``turn_index`` (B, T) (required), ``values`` (B, T) or ``turn_values`` (B, K) (one of
    them required), ``turn_rewards`` / ``turn_mask`` (B, K) (optional; default from
    ``token_level_rewards``), ``gamma``, ``lam``, ``whiten``. Ignores group_ids, step_keys, scores, eps,
    norm_by_std.

    V_k, the value of the state turn k starts from, is ``turn_values[:, k]`` if given, else ``values`` at the
    turn's first agent token (trajlake's ValueModel gives position t the value of the state before token t
    is chosen: for a turn's first agent token, the state after its whole observation). Over each row's
    valid turns in order: ``delta_k = r_k + gamma * V_{k'} - V_k`` (k' the next valid turn; V after the last
    = 0), ``A_k = delta_k + gamma * lam * A_{k'}``. Values at other tokens are never read; a valid turn
    without agent tokens needs ``turn_values``.

    Returns ``(advantages, returns)``, (B, T), zero outside the mask: A_k and ``R_k = A_k + V_k`` on every
    agent token of turn k (R_k = r_k + gamma((1 - lam) V_{k'} + lam R_{k'}) does not depend on V_k, so it
    is the same TD(lambda) target for every state inside turn k; use it with the value loss over the mask).
    With ``whiten`` the advantages (not the returns) are whitened over all agent tokens of the batch.
    """
    _missing("turn_gae", turn_index=(turn_index, TURN_INDEX_WHAT),
             values=(values if turn_values is None else (), "(B, T): the critic's values, or turn_values (B, K)"))
    tv = None if turn_values is None else torch.as_tensor(turn_values, device=mask.device)
    tr = _turns("turn_gae", token_level_rewards, mask, turn_index, turn_rewards, turn_mask, tv, values)
    f64 = torch.float64
    B, K = tr.r.shape
    zero = torch.zeros((), dtype=f64, device=tr.m.device)
    if tv is not None:
        V = torch.where(tr.valid, tv.detach().to(f64), zero)
    else:
        if values.shape != tr.m.shape:
            raise ValueError(f"turn_gae: values must have the mask's shape {tuple(tr.m.shape)}, got "
                             f"{tuple(values.shape)}")
        bad = tr.valid & ~tr.has_tok
        if bool(bad.any()):
            b, k = (int(i) for i in bad.nonzero()[0])
            raise ValueError(f"turn_gae: turn {k} of row {b} is in turn_mask but has no agent token to read its "
                             "value at: pass turn_values (B, K)")
        first = _first_positions(tr.slot, K)
        v = torch.where(tr.m, values.detach().to(f64), zero)
        V = torch.where(tr.has_tok, torch.gather(v, 1, first.clamp(min=0)), zero)
    A = torch.zeros_like(tr.r)
    next_v = torch.zeros(B, dtype=f64, device=tr.m.device)
    next_a = torch.zeros_like(next_v)
    for k in range(K - 1, -1, -1):
        ok = tr.valid[:, k]
        a = tr.r[:, k] + gamma * next_v - V[:, k] + gamma * lam * next_a
        A[:, k] = torch.where(ok, a, zero)
        next_a = torch.where(ok, a, next_a)
        next_v = torch.where(ok, V[:, k], next_v)
    adv, ret = tr.broadcast(A), tr.broadcast(A + V)
    if whiten:
        adv = masked_whiten(adv, tr.m)
    return adv, ret

