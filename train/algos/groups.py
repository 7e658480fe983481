"""Which GRPO groups an update learns from: group filters, registered in GROUP_FILTERS.

A group is the K samples of one task. Its outcome is each sample's success flag; its reward also holds the
shaping terms of the spec (per-turn progress, format bonuses). When every sample of a group has the same
outcome, the only differences left are shaping noise, and a group-std normalisation (grpo) scales that noise up
to the size a win gets: on TextCraft, groups without a win had raw reward std 0.04 and mean |advantage| 0.70.
DAPO's dynamic sampling, GiGPO and RAGEN keep only groups whose outcomes differ; ``outcome_differs`` does that,
``all`` keeps every group (the behaviour before the filter existed).

Every filter has the same keyword-only signature: ``fn(success=(B,) bool, group_ids=B hashables) -> (B,) bool``,
True for the rows whose advantages the update keeps (a dropped row's advantage is set to 0, so
``drop_zero_advantage`` leaves it out of the update, and an update with no row left is skipped).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass

import torch

from trajlake.core.registry import Registry
from trajlake.train.algos.advantages import group_index


@dataclass(frozen=True)
class GroupFilter:
    """A registered group filter: the function, and the fewest samples per group it needs to keep anything
    (``min_samples``: 2 for a filter that compares a group's samples)."""

    fn: Callable[..., torch.Tensor]
    min_samples: int = 1
    description: str = ""

    def __call__(self, *, success: torch.Tensor, group_ids: Sequence[Hashable]) -> torch.Tensor:
        return self.fn(success=success, group_ids=group_ids)


GROUP_FILTERS: Registry[GroupFilter] = Registry("group filter")


def outcome_groups(success: torch.Tensor, group_ids: Sequence[Hashable]) -> tuple[torch.Tensor, int, int]:
    """Per row (B,) bool: whether the row's group holds both a success and a failure; and (groups with an
    outcome difference, groups). ``success`` (B,) bool or 0/1, ``group_ids`` length B."""
    idx = group_index(group_ids, device=success.device)
    if idx.shape[0] != success.shape[0]:
        raise ValueError(f"group_ids has {idx.shape[0]} entries for a batch of {success.shape[0]}")
    if not idx.numel():
        return torch.zeros(0, dtype=torch.bool), 0, 0
    s = success.to(torch.long)
    groups = int(idx.max()) + 1
    wins = torch.zeros(groups, dtype=torch.long, device=s.device).index_add_(0, idx, s)
    count = torch.zeros(groups, dtype=torch.long, device=s.device).index_add_(0, idx, torch.ones_like(s))
    differs = (wins > 0) & (wins < count)
    return differs[idx], int(differs.sum()), groups


def register_group_filter(name: str, *, min_samples: int = 1, description: str = "") -> Callable:
    """Decorator: register ``fn(success=..., group_ids=...) -> (B,) bool`` as a :class:`GroupFilter`."""

    def deco(fn: Callable) -> Callable:
        GROUP_FILTERS.add(name, GroupFilter(fn, min_samples, description))
        return fn

    return deco


@register_group_filter("all", description="every group, whatever its outcomes")
def keep_all_groups(*, success: torch.Tensor, group_ids: Sequence[Hashable]) -> torch.Tensor:
    """Every row: (B,) True."""
    return torch.ones(success.shape[0], dtype=torch.bool, device=success.device)


@register_group_filter("outcome_differs", min_samples=2,
                       description="only groups holding both a success and a failure (DAPO's dynamic sampling)")
def keep_outcome_differs(*, success: torch.Tensor, group_ids: Sequence[Hashable]) -> torch.Tensor:
    """The rows of groups whose samples' success flags differ: (B,) bool. A group all won or all lost carries no
    outcome gradient, and its shaping differences alone would be noise scaled to a win's size."""
    return outcome_groups(success, group_ids)[0]


__all__ = ["GROUP_FILTERS", "GroupFilter", "keep_all_groups", "keep_outcome_differs", "outcome_groups",
           "register_group_filter"]
