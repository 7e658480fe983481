"""The `env_reward` kind: the env's per-step rewards, summed with a discount per turn and clipped."""

from __future__ import annotations

from trajlake.core.errors import TrajlakeError
from trajlake.rewards.component_kind import ComponentKind, no_columns, sql_number


def _check(p: dict) -> None:
    g = p["discount"]
    if not isinstance(g, (int, float)) or not 0 < g <= 1:
        raise TrajlakeError(f"discount must be in (0, 1], got {g!r}")
    for k in ("clip_min", "clip_max"):
        if p[k] is not None:
            sql_number(p[k])


def _aggregates(n: str, p: dict) -> dict[str, str]:
    return {f"{n}__sum": f"sum(coalesce(step_reward, 0) * pow({sql_number(p['discount'])}, turn))"}


def _value(n: str, p: dict) -> str:
    v = f"coalesce(agg.{n}__sum, 0)"
    if p["clip_min"] is not None:
        v = f"greatest({v}, {sql_number(p['clip_min'])})"
    if p["clip_max"] is not None:
        v = f"least({v}, {sql_number(p['clip_max'])})"
    return v


ENV_REWARD = ComponentKind(
    kind="env_reward",
    doc="Sum of the per-step env rewards, discounted by `discount` per turn (1.0: plain sum), clipped to "
    "[clip_min, clip_max] when given.",
    defaults={"discount": 1.0, "clip_min": None, "clip_max": None},
    check=_check,
    turn_columns=no_columns,
    aggregates=_aggregates,
    value=_value,
)
