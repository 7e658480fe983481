"""The entry every reward component kind is, and the parameter checks the kinds share.

A kind contributes (a) per-turn columns computed over `turns` (process rewards), (b) per-episode
aggregates over those turns, and (c) one episode-level expression over `episodes` columns and its
aggregates. `compile.py` assembles every component of a spec into one query. A kind whose values are
computed outside SQL (python) declares `compute`: `score` runs it on an Arrow table of the episodes and the
query joins its result. The built-in kinds are one module each in `rewards/kinds/`; `rewards/components.py`
registers them, and compile.py and score.py ask a kind's hooks, never its name.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from trajlake.core.errors import TrajlakeError


@dataclass(frozen=True, kw_only=True)
class ComponentKind:
    """A component kind: its parameters with defaults, a validator, and its SQL builders."""

    kind: str
    doc: str
    defaults: dict[str, Any]
    check: Callable[[dict], None]
    #: per-turn value columns: alias suffix -> SQL over a turns row (plus `prev_observation`)
    turn_columns: Callable[[str, dict], dict[str, str]]
    #: per-episode aggregates: alias -> aggregate SQL over the component's turn columns and turns
    aggregates: Callable[[str, dict], dict[str, str]]
    #: the episode's value: SQL over `ep.*` (episodes) and `agg.*` (the aggregates)
    value: Callable[[str, dict], str]
    #: parameters added after specs were stored, with the value that keeps the old meaning: left out of a
    #: spec's normalised content at that value, so the ids of specs that do not use them stay the same (the
    #: rule runs follow too: core.config_types.added_later)
    added_later: dict[str, Any] = field(default_factory=dict)
    #: whether its turn columns are per-turn rewards (the `per_turn` allocation places them on their turn)
    per_turn: bool = False
    #: whether its turn columns read `prev_observation` (a window over every turn, so computed only if asked)
    reads_prev_observation: Callable[[dict], bool] = lambda p: False
    #: values computed outside SQL: (name, params, episodes Arrow table) -> one float per row; the query then
    #: reads them as `py_<name>.value`
    compute: Callable[[str, dict, Any], Any] | None = None


def sql_number(v: Any) -> str:
    """A finite number as a SQL DOUBLE literal; anything else (a bool, a string, inf, NaN) is refused."""
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise TrajlakeError(f"expected a finite number, got {v!r}")
    return repr(float(v))


def check_choice(params: dict, key: str, options: tuple[str, ...]) -> None:
    """Refuse `params[key]` unless it is one of `options`."""
    if params[key] not in options:
        raise TrajlakeError(f"{key} must be one of {', '.join(options)}, got {params[key]!r}")


def no_columns(name: str, params: dict) -> dict[str, str]:
    """The turn columns (or aggregates) of a kind that has none."""
    return {}
