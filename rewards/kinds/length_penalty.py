"""The `length_penalty` kind: a penalty for replies longer than `max` or shorter than `min`."""

from __future__ import annotations

from trajlake.core.errors import TrajlakeError
from trajlake.rewards.component_kind import ComponentKind, check_choice, no_columns, sql_number


def _check(p: dict) -> None:
    check_choice(p, "unit", ("tokens", "chars"))
    check_choice(p, "scope", ("last", "episode"))
    check_choice(p, "shape", ("linear", "quadratic", "log"))
    if p["max"] is None and p["min"] is None:
        raise TrajlakeError("length_penalty needs max and/or min")
    for k in ("max", "min"):
        if p[k] is not None and (not isinstance(p[k], int) or p[k] < 0):
            raise TrajlakeError(f"{k} must be a non-negative integer, got {p[k]!r}")
    sql_number(p["scale"])


def _aggregates(n: str, p: dict) -> dict[str, str]:
    """The measured length: the last reply's (arg_max over turn) or the episode's sum, in tokens or chars."""
    measure = "num_response_tokens" if p["unit"] == "tokens" else "length(coalesce(action_text, ''))"
    if p["scope"] == "last":
        return {f"{n}__len": f"arg_max({measure}, turn)"}
    return {f"{n}__len": f"sum({measure})"}


def _value(n: str, p: dict) -> str:
    length = f"coalesce(agg.{n}__len, 0)"
    excess = " + ".join(
        [f"greatest({length} - {p['max']}, 0)"] * (p["max"] is not None)
        + [f"greatest({p['min']} - {length}, 0)"] * (p["min"] is not None)
    )
    shaped = {"linear": f"({excess})", "quadratic": f"pow({excess}, 2)", "log": f"ln(1 + ({excess}))"}[p["shape"]]
    return f"-{sql_number(p['scale'])} * {shaped}"


LENGTH_PENALTY = ComponentKind(
    kind="length_penalty",
    doc="Penalty -scale * f(excess) for replies longer than `max` or shorter than `min`, in `unit` tokens "
    "(agent tokens) or chars (characters of the reply text, as Python's len), over the `scope` last reply or "
    "the whole episode; f is the `shape`, on both sides: linear (x), quadratic (x^2) or log (ln(1+x)). "
    "OpenManus-RL's LengthPenalty is unit chars, scope last, its -weight as scale; it shapes only the long "
    "side and penalises a short reply only when linear, so the two agree for shape linear (its default).",
    defaults={"unit": "tokens", "scope": "last", "max": None, "min": None, "shape": "linear", "scale": 0.01},
    check=_check,
    turn_columns=no_columns,
    aggregates=_aggregates,
    value=_value,
)
