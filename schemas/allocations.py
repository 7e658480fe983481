"""Allocation strategies: how an episode's reward is spread over its agent tokens, registered in ALLOCATIONS.

A strategy is SQL over an agent segment (a turn's reply tokens), written once here and used by both places that
allocate: the `reward_spans` view (schemas/views.py, over stored totals, every spec's strategy in one CASE) and
the scoring query's own spans (rewards/allocation.py, one spec's). Each gets the segment's values under its own
column names (`Segment`), so the same expressions give the same doubles in both (tests/test_rewards_recompute.py
holds them to it). Adding a strategy is one `ALLOCATIONS.add` (docs/extending.md); a spec's
`[allocation] strategy` names it.

The segment values an expression may read: `total` (the episode's reward), `after` (the episode's agent tokens
after this segment: 0 on the last), `agent` (all its agent tokens), `n` (this segment's), `gamma` (the spec's
allocation gamma, a DOUBLE), and for a strategy that reads `process` rewards, `process` (this turn's weighted
process rewards, turn_rewards) and `process_total` (those of the segments up to this one).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from trajlake.core.registry import Registry


@dataclass(frozen=True)
class Segment:
    """The SQL expressions for one agent segment's values, as the query that allocates names them."""

    total: str
    after: str
    agent: str
    n: str
    gamma: str
    process: str
    process_total: str


@dataclass(frozen=True)
class Allocation:
    """A strategy: `reward(seg)`, the SQL for the reward of each token of the segment's span; `every_token(seg)`,
    SQL true when the span is every token of the segment (else it is the segment's last token alone);
    `process`, whether it reads the turns' process rewards (turn_rewards, written by the scoring query);
    `discounts`, whether it discounts the reward across turns itself (a turn-level advantage estimator, which
    discounts with its own gamma, is refused beside it)."""

    reward: Callable[[Segment], str]
    every_token: Callable[[Segment], str]
    process: bool = False
    discounts: bool = False
    description: str = ""


ALLOCATIONS: Registry[Allocation] = Registry("allocation strategy")
ALLOCATIONS.add("last_token", Allocation(
    reward=lambda s: f"CASE WHEN {s.after} = 0 THEN {s.total} ELSE 0 END",
    every_token=lambda s: "false",
    description="R on the last agent token"))
ALLOCATIONS.add("uniform_positive", Allocation(
    reward=lambda s: (f"CASE WHEN {s.total} > 0 THEN {s.total} / {s.agent} WHEN {s.after} = 0 THEN {s.total} "
                      "ELSE 0 END"),
    every_token=lambda s: f"{s.total} > 0",
    description="R > 0 spread evenly over all agent tokens; R < 0 on the last agent token"))
ALLOCATIONS.add("discounted", Allocation(
    reward=lambda s: f"{s.total} * pow({s.gamma}, {s.after}) / {s.n}",
    every_token=lambda s: "true",
    discounts=True,
    description="each token of a segment c / len(segment), c starting at R and multiplied by gamma ** len(segment) "
                "from the last segment back (OpenManus-RL's discounted allocation)"))
ALLOCATIONS.add("per_turn", Allocation(
    reward=lambda s: f"{s.process} + CASE WHEN {s.after} = 0 THEN {s.total} - {s.process_total} ELSE 0 END",
    every_token=lambda s: "false",
    process=True,
    description="each turn's process rewards on its last agent token, the rest of R on the episode's last"))


def by_strategy(column: str, seg: Segment, part: str) -> str:
    """`part` ("reward" or "every_token") of every registered strategy as one SQL CASE on the strategy name in
    `column` (the view allocates every spec's episodes in one query)."""
    whens = " ".join(f"WHEN '{name}' THEN {getattr(entry, part)(seg)}" for name, entry in ALLOCATIONS.items())
    return f"CASE {column} {whens} END"


__all__ = ["ALLOCATIONS", "Allocation", "Segment", "by_strategy"]
