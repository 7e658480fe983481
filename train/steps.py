"""One update over a batch: PPO/GRPO (`prepare` then `rl_update`) and SFT (`sft_update`).

Every loss and estimator comes from the registries of train/algos/ by name. A mini-batch is split over the
processes (rows dealt by length) and each share into length-bucketed micro-batches (train/microbatch.py);
every loss is aggregated with the token (or sequence) count of the whole mini-batch over all processes as
its denominator, so the gradient of a mini-batch is the same whatever the number of processes and
micro-batches.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from trajlake.core.errors import TrajlakeError
from trajlake.train.algos import (
    ADVANTAGES,
    GROUP_FILTERS,
    KL_PLACEMENTS,
    OLD_LOGPROB_SOURCES,
    POLICY_LOSSES,
    VALUE_LOSSES,
    aggregate,
    apply_kl_penalty,
    kl_penalty,
    masked_mean,
    outcome_groups,
)
from trajlake.train.batch import Batch, collate
from trajlake.train.config import TrainConfig
from trajlake.train.distributed import device
from trajlake.train.engine import Engines, optimizer_step
from trajlake.train.finite import check_update
from trajlake.train.forward import (
    Context,
    can_share_prefix,
    context_loss,
    first_scored,
    forward_logprobs,
    forward_values,
    prefix_context,
    prefix_to_share,
)
from trajlake.train.microbatch import Meter, denominator, micro_shares, per_token, take


@dataclass
class Prepared:
    """Per-token tensors of the whole batch, (B, T): what the epochs read."""

    batch: Batch
    old_logprobs: torch.Tensor
    advantages: torch.Tensor
    returns: torch.Tensor
    token_rewards: torch.Tensor
    ref_logprobs: torch.Tensor | None = None
    values: torch.Tensor | None = None
    is_weights: torch.Tensor | None = None
    #: pi_old of the rows the actor trains on is the update's own log-probs, detached (see
    #: `old_logprobs_from_update`):
    #: `old_logprobs` then holds only the other rows' (0 where not needed)
    on_policy: bool = False
    #: with `on_policy`: (sum, count) of behaviour - old over the rows not trained, for the behaviour_kl
    #: metric the update completes
    behaviour_kl_rest: tuple[float, float] = (0.0, 0.0)


def old_logprobs_from_update(engines: Engines, batch: Batch, cfg: TrainConfig) -> bool:
    """The on-policy shortcut: whether pi_old (old_logprobs = recompute: a forward pass over the batch before
    the update) is exactly the actor as the update finds it, so the update's own log-probs (detached) can
    stand for it and that pass is saved (`Prepared.on_policy`). It is for one epoch whose actor rows fit one
    mini-batch (a single optimizer step, after every micro-batch's loss), no dropout (train- and eval-mode
    passes agree), the actor trained every iteration (no critic warm-up), and nothing needing pi_old before
    the update (is_cap, a KL penalty in the rewards)."""
    if not (OLD_LOGPROB_SOURCES[cfg.algorithm.old_logprobs].recomputed and cfg.optim.epochs == 1
            and batch.size <= cfg.optim.minibatch_size
            and cfg.critic.warmup == 0 and cfg.algorithm.is_cap is None
            and not (engines.ref is not None and KL_PLACEMENTS[cfg.kl.mode].in_rewards)):
        return False
    module = getattr(engines.actor, "module", engines.actor)
    if any(isinstance(m, torch.nn.Dropout) and m.p > 0 for m in module.modules()):
        return False
    config = getattr(module, "config", None)
    items = config.to_dict().items() if hasattr(config, "to_dict") else ()
    return not any(("dropout" in k or "pdrop" in k) and isinstance(v, (int, float)) and not isinstance(v, bool)
                   and v > 0 for k, v in items)


def _old_logprobs(engines: Engines, batch: Batch, cfg: TrainConfig) -> torch.Tensor:
    share = can_share_prefix(engines.actor)
    return per_token(batch, cfg, lambda s: forward_logprobs(engines.actor, s.input_ids, s.attention_mask,
                                                               temperature=cfg.rollout.temperature,
                                                               start=first_scored(s.loss_mask),
                                                               share_prefix=share)[0], engines, share=share)


def turn_inputs(name: str, batch: Batch, cfg: TrainConfig) -> dict:
    """What estimator `name` reads beyond the keywords every estimator gets, as its registry entry declares:
    the turn structure of the batch (its ``turn_inputs``) and its own settings from `cfg` (its ``params``);
    nothing for a token-level estimator without settings."""
    estimator = ADVANTAGES[name]
    if estimator.turn_inputs and batch.turn_index is None:
        raise TrajlakeError(f"advantage {name} needs the turn structure of stored episodes; this batch has none")
    return {**{k: getattr(batch, k) for k in estimator.turn_inputs}, **estimator.settings(cfg)}


def prepare(engines: Engines, batch: Batch, cfg: TrainConfig, kl_ctl) -> tuple[Prepared, dict[str, float]]:
    """Old and reference log-probs, values, KL penalty, advantages for a batch (no gradient). The rows of the
    groups cfg's group filter leaves out get advantage 0 (`outcome_groups`: the share of groups whose samples'
    success differs)."""
    keep = GROUP_FILTERS[cfg.group_filter_name](success=batch.success, group_ids=batch.group_ids)
    _, differ, groups = outcome_groups(batch.success, batch.group_ids)
    metrics: dict[str, float] = {"outcome_groups": differ / groups if groups else 0.0, "groups": float(groups),
                                 "groups_kept": float(len({g for g, k in zip(batch.group_ids, keep.tolist(),
                                                                             strict=True) if k}))}
    mask = batch.loss_mask
    beh = _Behaviour.of(batch)
    engines.actor.eval()
    old, lazy, is_weights = _pi_old(engines, batch, cfg, beh, metrics)
    ref, rewards = _reference(engines, batch, cfg, kl_ctl, keep, old, metrics)
    values = None
    if engines.critic is not None:
        engines.critic.eval()
        values = per_token(batch, cfg, lambda s: forward_values(engines.critic, s.input_ids, s.attention_mask),
                           engines)
    adv, ret = _advantages(batch, cfg, rewards, values, keep, metrics)
    rest = (0.0, 0.0)
    if lazy and cfg.algorithm.drop_zero_advantage:  # pi_old of the rows left out of the update (no advantage) is
        # needed only for the behaviour_kl metric
        others = (~(adv * mask != 0).any(-1) & beh.both.any(-1)).nonzero()[:, 0].tolist()
        if others:
            sub = batch.rows(others, width=batch.input_ids.shape[1])
            old[others] = _old_logprobs(engines, sub, cfg)
            sel = beh.both[others]
            rest = (float((beh.logprobs[others] - old[others])[sel].sum()), float(sel.sum()))
    prep = Prepared(batch, old * mask, adv.float(), ret.float(), rewards, ref, values, is_weights, on_policy=lazy,
                    behaviour_kl_rest=rest)
    return prep, metrics


@dataclass(frozen=True)
class _Behaviour:
    """A batch's behaviour log-probs as the update reads them: `logprobs` (B, T), 0 where unknown; `known`, where
    they are known or not needed (off the mask); `both`, agent tokens with a known one."""

    logprobs: torch.Tensor
    known: torch.Tensor
    both: torch.Tensor

    @classmethod
    def of(cls, batch: Batch) -> _Behaviour:
        nan = torch.isnan(batch.behaviour_logprobs)
        mask = batch.loss_mask
        return cls(torch.nan_to_num(batch.behaviour_logprobs, nan=0.0), ~nan | (mask == 0), ~nan & (mask > 0))


def _pi_old(engines: Engines, batch: Batch, cfg: TrainConfig, beh: _Behaviour,
            metrics: dict[str, float]) -> tuple[torch.Tensor, bool, torch.Tensor | None]:
    """(pi_old's log-probs (B, T), whether the update's own pass stands for them (`old_logprobs_from_update`: then
    zeros here), the truncated importance weights with is_cap (else None)), as the run's old-log-prob source
    says; the behaviour_kl and is_weight_mean metrics into `metrics`."""
    mask = batch.loss_mask
    lazy = old_logprobs_from_update(engines, batch, cfg)
    recomputed = OLD_LOGPROB_SOURCES[cfg.algorithm.old_logprobs].recomputed
    if not recomputed:
        if not bool(beh.known.all()):
            bad = batch.episode_ids[int((~beh.known).any(-1).nonzero()[0, 0])]
            raise TrajlakeError(f"episode {bad} has no behaviour log-probs (a text policy played it): use "
                                "old_logprobs = recompute")
        old = beh.logprobs * mask
        # the ratio needs no pi_old, but how far the policy now is from the one that played is worth knowing
        if beh.both.any():
            metrics["behaviour_kl"] = float((beh.logprobs - _old_logprobs(engines, batch, cfg))[beh.both].mean())
    elif lazy:
        old = torch.zeros_like(mask)  # filled in by prepare for the rows the actor does not train on
    else:
        old = _old_logprobs(engines, batch, cfg)
    is_weights = None
    if cfg.algorithm.is_cap is not None:
        w = torch.exp((old - beh.logprobs).clamp(-20, 20)).clamp(max=cfg.algorithm.is_cap)
        is_weights = torch.where(beh.known & (mask > 0), w, torch.ones_like(w))
        metrics["is_weight_mean"] = float(masked_mean(is_weights, mask))
    if beh.both.any() and not lazy and recomputed:  # k1 estimate of KL(mu || pi_old)
        metrics["behaviour_kl"] = float((beh.logprobs - old)[beh.both].mean())
    return old, lazy, is_weights


def _reference(engines: Engines, batch: Batch, cfg: TrainConfig, kl_ctl, keep: torch.Tensor, old: torch.Tensor,
               metrics: dict[str, float]) -> tuple[torch.Tensor | None, torch.Tensor]:
    """(the reference policy's log-probs where a KL anchor needs them, else None; the token rewards, less the KL
    penalty where the run's KL placement puts it in the rewards)."""
    rewards = batch.token_rewards.clone()
    in_rewards = KL_PLACEMENTS[cfg.kl.mode].in_rewards
    if engines.ref is None or not (bool(keep.any()) or in_rewards or not cfg.algorithm.drop_zero_advantage):
        return None, rewards
    ref = per_token(batch, cfg, lambda s: forward_logprobs(engines.ref, s.input_ids, s.attention_mask,
                                                              temperature=cfg.rollout.temperature)[0], engines)
    if in_rewards:
        rewards, m = apply_kl_penalty(rewards, old, ref, batch.loss_mask, kl_ctl.value, cfg.kl.estimator)
        kl_ctl.update(m["kl"], batch.size)
        metrics["kl"] = m["kl"]
    return ref, rewards


def _advantages(batch: Batch, cfg: TrainConfig, rewards: torch.Tensor, values: torch.Tensor | None,
                keep: torch.Tensor, metrics: dict[str, float]) -> tuple[torch.Tensor, torch.Tensor]:
    """(advantages, returns), both (B, T): the run's estimator, 0 for the groups the filter leaves out, raised to
    advantage_floor where one is set; their mean and mean magnitude (and the share floored) into `metrics`."""
    mask = batch.loss_mask
    adv, ret = ADVANTAGES[cfg.advantage_name](
        token_level_rewards=rewards, mask=mask, values=values, group_ids=batch.group_ids, gamma=cfg.algorithm.gamma,
        lam=cfg.algorithm.lam, whiten=cfg.algorithm.whiten_advantages, norm_by_std=cfg.algorithm.norm_adv_by_std,
        **turn_inputs(cfg.advantage_name, batch, cfg))
    adv = torch.where(keep.to(adv.device).unsqueeze(-1), adv, torch.zeros_like(adv))
    m = mask > 0
    if cfg.algorithm.advantage_floor is not None:
        floored = (adv < cfg.algorithm.advantage_floor) & m
        metrics["adv_floored"] = float(floored.any(-1).float().mean())  # the share of sequences raised
        adv = torch.where(floored, torch.full_like(adv, cfg.algorithm.advantage_floor), adv)
    metrics.update(adv_mean=float(adv[m].mean()), adv_abs_mean=float(adv[m].abs().mean()))
    return adv, ret


def _context(engine, batch: Batch, rows: list[int], engines: Engines, n_micro: int) -> Context | None:
    """The Context of the prefix every row of the mini-batch starts with (a system prompt), when there are
    several micro-batches to read it for and one process (with several, each would need its own)."""
    if engines.world != 1 or n_micro < 2 or not rows:
        return None
    sub = batch.rows(rows)
    length = prefix_to_share(sub.input_ids, sub.attention_mask, sub.loss_mask)
    if not length:
        return None
    return prefix_context(engine, sub.input_ids[:1, :length])


def minibatch_step(engine, batch: Batch, rows: list[int], cfg: TrainConfig, engines: Engines,
                   micro_loss: Callable, meter: Meter, prefix: str = "", share: bool = False,
                   summed: tuple[str, ...] = ()) -> None:
    """One optimizer step of `engine` over the mini-batch `rows`: `micro_loss(sub, idx, denominator)` gives
    each micro-batch's (loss, metrics); the step's loss and gradient norm go to `meter`. `share`: the loss's
    forward reads a prefix shared by a micro-batch's rows once (see `micro_shares`), and a prefix shared by the
    whole mini-batch once for all micro-batches: then `micro_loss(sub, idx, denominator, context)`, and the
    prefix's share of the gradient goes back through its one pass before the step. `summed`: the metrics that
    are shares of the mini-batch's loss (the loss's `Loss.summed`), added up; the others are token means."""
    engine.train()
    denom = denominator(batch, rows, cfg, engines.world)
    micro = list(micro_shares(batch, rows, cfg, engines.world, engines.rank, share))
    ctx = _context(engine, batch, rows, engines, len(micro)) if share else None
    sums = {"loss": 0.0}
    norm: float | None = None
    for k, (sub, idx) in enumerate(micro):
        boundary = k == len(micro) - 1 and ctx is None
        engine.set_gradient_accumulation_boundary(boundary)
        loss, metrics = micro_loss(sub, idx, denom, ctx) if share else micro_loss(sub, idx, denom)
        engine.backward(loss, scale_wrt_gas=False)
        sums["loss"] += float(loss.detach())
        weight = float(sub.loss_mask.sum())
        for name, v in metrics.items():
            if name in summed:  # a share of the mini-batch's loss (global denominator): add up
                sums[name] = sums.get(name, 0.0) + float(v)
            else:  # a mean over the micro-batch's tokens: weigh by them
                meter.add(prefix + name, v, weight)
        if boundary:
            norm = optimizer_step(engine)
        else:
            engine.step()
    if ctx is not None:  # the shared prefix's share of the gradient (none when no micro-batch read it)
        engine.set_gradient_accumulation_boundary(True)
        surrogate = context_loss(ctx)
        engine.backward(surrogate if surrogate is not None else torch.zeros((), requires_grad=True),
                        scale_wrt_gas=False)
        norm = optimizer_step(engine)
    # before the step's numbers reach a metric or a checkpoint: a NaN or inf stops the run (train/finite.py)
    check_update(engine, loss=sums["loss"], grad_norm=norm, prefix=prefix.replace("_", " "))
    if norm is not None:
        meter.add(prefix + "grad_norm", norm)
    for name, v in sums.items():  # averaged over processes, these are the mini-batch's losses
        meter.add(prefix + name, v)


def actor_loss_terms(lp: torch.Tensor, ent: torch.Tensor, mask: torch.Tensor, cfg: TrainConfig, kl_ctl,
                     denom: float | None, *, old_logprobs: torch.Tensor, advantages: torch.Tensor,
                     is_weights: torch.Tensor | None = None, ref_logprobs: torch.Tensor | None = None):
    """The actor's loss on one micro-batch, all (b, t): POLICY_LOSSES[cfg.algorithm.policy_loss], minus the entropy
    bonus, plus the KL loss (kl_mode loss, when `ref_logprobs` is given). Returns (loss, metrics)."""
    policy_loss = POLICY_LOSSES[cfg.algorithm.policy_loss]
    loss, m = policy_loss(log_probs=lp, old_log_probs=old_logprobs, advantages=advantages, mask=mask,
                          agg_mode=cfg.optim.agg_mode, is_weights=is_weights, denominator=denom,
                          norm_constant=cfg.norm_constant, **policy_loss.settings(cfg))
    m = dict(m)
    with torch.no_grad():
        m["entropy"] = float(masked_mean(ent, mask))
    if cfg.algorithm.entropy_coef > 0:
        loss = loss - cfg.algorithm.entropy_coef * aggregate(ent, mask, cfg.optim.agg_mode, denominator=denom,
                                                   norm_constant=cfg.norm_constant)
    if ref_logprobs is not None and not KL_PLACEMENTS[cfg.kl.mode].in_rewards:
        kl = kl_penalty(lp, ref_logprobs, mask, cfg.kl.estimator)
        loss = loss + kl_ctl.value * aggregate(kl, mask, cfg.optim.agg_mode, denominator=denom,
                                               norm_constant=cfg.norm_constant)
        m["kl"] = float(masked_mean(kl.detach(), mask))
    return loss, m


def _actor_loss(engines: Engines, prep: Prepared, cfg: TrainConfig, kl_ctl, meter: Meter, share: bool):
    """The actor's micro-batch loss for `minibatch_step`: `(sub, idx, denom, context) -> (loss, metrics)` on rows
    `idx` of the prepared batch (pi_old the update's own log-probs, detached, when `prep.on_policy`)."""
    def loss(sub: Batch, idx: list[int], denom: float, context: Context | None = None):
        w, mask = sub.input_ids.shape[1], sub.loss_mask.to(device())
        lp, ent = forward_logprobs(engines.actor, sub.input_ids, sub.attention_mask,
                                   temperature=cfg.rollout.temperature, entropy=True, start=first_scored(sub.loss_mask),
                                   share_prefix=share, context=context, entropy_grad=cfg.algorithm.entropy_coef > 0)
        if prep.on_policy:  # one optimizer step: pi_old is the actor as it is now
            old = lp.detach() * mask
            beh = sub.behaviour_logprobs.to(device())
            both = (mask > 0) & ~torch.isnan(beh)
            if both.any():
                meter.add("behaviour_kl", float((beh - old)[both].mean()), float(both.sum()))
        else:
            old = take(prep.old_logprobs, idx, w)
        return actor_loss_terms(lp, ent, mask, cfg, kl_ctl, denom, old_logprobs=old,
                                advantages=take(prep.advantages, idx, w),
                                is_weights=take(prep.is_weights, idx, w),
                                ref_logprobs=take(prep.ref_logprobs, idx, w))

    return loss


def _critic_loss(engines: Engines, prep: Prepared, cfg: TrainConfig):
    """The critic's micro-batch loss for `minibatch_step`: the run's value loss on rows `idx`."""
    def loss(sub: Batch, idx: list[int], denom: float):
        w, mask = sub.input_ids.shape[1], sub.loss_mask.to(device())
        v = forward_values(engines.critic, sub.input_ids, sub.attention_mask)
        vl = VALUE_LOSSES[cfg.critic.value_loss]
        return vl(values=v, old_values=take(prep.values, idx, w), returns=take(prep.returns, idx, w), mask=mask,
                  denominator=denom, agg_mode=cfg.optim.agg_mode, norm_constant=cfg.norm_constant, **vl.settings(cfg))

    return loss


def rl_update(engines: Engines, prep: Prepared, cfg: TrainConfig, kl_ctl, *, seed: int,
              train_actor: bool = True) -> dict[str, float]:
    """cfg.optim.epochs passes of shuffled mini-batches: the policy loss (+ entropy bonus, + KL loss) on the actor,
    the value loss on the critic (ppo)."""
    batch, meter, t0 = prep.batch, Meter(), time.perf_counter()
    share = can_share_prefix(engines.actor)
    actor_loss = _actor_loss(engines, prep, cfg, kl_ctl, meter, share)
    critic_loss = _critic_loss(engines, prep, cfg)
    gen = torch.Generator().manual_seed(seed)
    tokens = 0
    signal = (prep.advantages * batch.loss_mask != 0).any(-1)
    actor_rows = set(range(batch.size))
    if cfg.algorithm.drop_zero_advantage:
        actor_rows = set(signal.nonzero()[:, 0].tolist())
    meter.add("actor_sequences", len(actor_rows))
    # the share of rows whose advantage is non-zero somewhere: 0 means this update taught the actor nothing
    meter.add("signal_rows", float(signal.float().mean()) if batch.size else 0.0)
    if prep.on_policy and prep.behaviour_kl_rest[1] and engines.rank == 0:  # the rows not trained on
        meter.add("behaviour_kl", prep.behaviour_kl_rest[0] / prep.behaviour_kl_rest[1], prep.behaviour_kl_rest[1])
    for _ in range(cfg.optim.epochs):
        perm = torch.randperm(batch.size, generator=gen).tolist()
        if engines.critic is not None:
            for start in range(0, batch.size, cfg.optim.minibatch_size):
                rows = perm[start:start + cfg.optim.minibatch_size]
                minibatch_step(engines.critic, batch, rows, cfg, engines, critic_loss, meter, prefix="critic_",
                               summed=VALUE_LOSSES[cfg.critic.value_loss].summed)
        kept = [i for i in perm if i in actor_rows] if train_actor else []
        for start in range(0, len(kept), cfg.optim.minibatch_size):
            rows = kept[start:start + cfg.optim.minibatch_size]
            minibatch_step(engines.actor, batch, rows, cfg, engines, actor_loss, meter, share=share,
                           summed=POLICY_LOSSES[cfg.algorithm.policy_loss].summed)
            tokens += int(batch.attention_mask[torch.as_tensor(rows)].sum())
    out = meter.result()
    if prep.ref_logprobs is not None and not KL_PLACEMENTS[cfg.kl.mode].in_rewards and "kl" in out:
        kl_ctl.update(out["kl"], batch.size)
    out["kl_coef"] = float(kl_ctl.value) if engines.ref is not None else 0.0
    out["train_tokens_per_s"] = tokens / max(time.perf_counter() - t0, 1e-9)
    return out


def sft_loss(engines: Engines, cfg: TrainConfig):
    """The SFT micro-batch loss: cross-entropy (minus log-likelihood) on response tokens only."""
    share = can_share_prefix(engines.actor)

    def loss_fn(sub: Batch, idx: list[int], denom: float, context: Context | None = None):
        mask = sub.loss_mask.to(device())
        lp, _ = forward_logprobs(engines.actor, sub.input_ids, sub.attention_mask,
                                    start=first_scored(sub.loss_mask), share_prefix=share, context=context)
        loss = aggregate(-lp, mask, cfg.optim.agg_mode, denominator=denom, norm_constant=cfg.norm_constant)
        with torch.no_grad():
            nll = float(masked_mean(-lp, mask))
        return loss, {"nll": nll}

    return loss_fn


def sft_update(engines: Engines, batch: Batch, rows: list[int], cfg: TrainConfig) -> dict[str, float]:
    """One SFT optimizer step over the mini-batch `rows`."""
    meter = Meter()
    minibatch_step(engines.actor, batch, rows, cfg, engines, sft_loss(engines, cfg), meter,
                   share=can_share_prefix(engines.actor))
    return meter.result()


def iteration_update(engines: Engines, seqs: list, cfg: TrainConfig, kl_ctl,
                     it: int) -> tuple[Batch, dict[str, float]]:
    """The update of RL iteration `it` (from 0) on its episodes `seqs` (load_episodes' EpisodeSeqs, in
    episode_id order): collate, prepare, `rl_update` seeded with seed + it. The train loop and a replay of
    one of its steps (`trajlake train --replay`) both call it, so a replay repeats the step's exact ops.
    Returns the batch and the metrics of prepare and the update."""
    batch = collate(seqs, engines.pad_id)
    prep, m_prep = prepare(engines, batch, cfg, kl_ctl)
    m_upd = rl_update(engines, prep, cfg, kl_ctl, seed=cfg.run.seed + it, train_actor=it >= cfg.critic.warmup)
    return batch, {**m_prep, **m_upd}
