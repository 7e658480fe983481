"""The `format` kind: whether the replies are well formed, by the template's parser or by a regex."""

from __future__ import annotations

from trajlake.core.errors import TrajlakeError
from trajlake.core.sql_text import sql_str
from trajlake.rewards.component_kind import ComponentKind, check_choice, no_columns
from trajlake.rewards.expr_checks import check_regex


def _check(p: dict) -> None:
    if not isinstance(p["dotall"], bool):
        raise TrajlakeError(f"dotall must be true or false, got {p['dotall']!r}")
    if p["pattern"] is None:
        if p["dotall"]:
            raise TrajlakeError("dotall needs a pattern (without one, format reads the template's format_ok flag)")
    else:
        check_regex(p["pattern"])
    check_choice(p, "over", ("each", "last"))
    envs = p["envs"]
    if envs is not None and (not isinstance(envs, list) or not envs
                             or not all(isinstance(e, str) and e for e in envs)):
        raise TrajlakeError(f"envs must be a non-empty list of env names, got {envs!r}")


def _hit(p: dict) -> str:
    """1.0 / 0.0 per reply; NULL when the reply's template flag is unknown (read by neither avg nor coalesce)."""
    if p["pattern"] is None:
        return "CAST(format_ok AS DOUBLE)"
    # option 's': `.` matches newlines too, as Python's re.DOTALL
    flags = ", 's'" if p["dotall"] else ""
    return f"CASE WHEN regexp_matches(coalesce(action_text, ''), {sql_str(p['pattern'])}{flags}) THEN 1.0 ELSE 0.0 END"


def _aggregates(n: str, p: dict) -> dict[str, str]:
    if p["over"] == "each":
        return {f"{n}__v": f"avg({_hit(p)})"}
    return {f"{n}__v": f"arg_max_null({_hit(p)}, turn)"}


def _value(n: str, p: dict) -> str:
    v = f"coalesce(agg.{n}__v, 0)"
    if p["envs"] is not None:
        v = f"CASE WHEN ep.env IN ({', '.join(sql_str(e) for e in p['envs'])}) THEN {v} ELSE 0.0 END"
    return v


FORMAT = ComponentKind(
    kind="format",
    doc="Whether the replies are well formed: without a `pattern`, as the action template the episode was "
    "played (or imported) with judged each reply (turns.format_ok, set by that template's parser); with a "
    "`pattern`, whether that regex is found in the reply (RE2 syntax, as DuckDB's regexp_matches; `dotall = "
    "true` lets `.` match newlines too, as Python's re.DOTALL). The value is the fraction of well-formed "
    "replies (`over = \"each\"`; replies whose format_ok is unknown are not counted) or 1/0 for the last reply "
    "(`over = \"last\"`; unknown: 0). `envs` (a list of env names) limits it to those envs' episodes; "
    "others get 0.",
    defaults={"pattern": None, "dotall": False, "over": "each", "envs": None},
    check=_check,
    turn_columns=no_columns,
    aggregates=_aggregates,
    value=_value,
    added_later={"dotall": False, "envs": None},
)
