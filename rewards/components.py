"""Reward component kinds: each validates its parameters and compiles to SQL.

A kind contributes (a) per-turn columns computed over `turns` (process rewards), (b) per-episode
aggregates over those turns, and (c) one episode-level expression over `episodes` columns and its
aggregates. `compile.py` assembles every component of a spec into one query. Python components are the
exception: their function runs on an Arrow table and its result joins the query as a table.
"""

from __future__ import annotations

import importlib
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import duckdb

from trajlake.schemas.tables import TABLES
from trajlake.store.errors import TrajlakeError

_KINDS: dict[str, ComponentKind] = {}


@dataclass(frozen=True)
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


def register(kind: ComponentKind) -> ComponentKind:
    _KINDS[kind.kind] = kind
    return kind


def kinds() -> list[str]:
    return sorted(_KINDS)


def get_kind(kind: str | None) -> ComponentKind:
    if kind not in _KINDS:
        raise TrajlakeError(f"unknown component kind {kind!r}; valid: {', '.join(kinds())}")
    return _KINDS[kind]


def validate_component(kind: str | None, params: dict[str, Any]) -> dict[str, Any]:
    """Fill defaults, refuse unknown keys, and run the kind's checks; returns the normalised params."""
    k = get_kind(kind)
    unknown = set(params) - set(k.defaults)
    if unknown:
        raise TrajlakeError(f"unknown parameter(s) {', '.join(sorted(unknown))}; "
                            f"{kind} takes {', '.join(sorted(k.defaults)) or 'none'}")
    full = {**k.defaults, **params}
    k.check(full)
    return full


def sql_str(s: str) -> str:
    return "'" + s.replace("'", "''") + "'"


def _num(v: Any) -> str:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise TrajlakeError(f"expected a finite number, got {v!r}")
    return repr(float(v))


def _choice(params: dict, key: str, options: tuple[str, ...]) -> None:
    if params[key] not in options:
        raise TrajlakeError(f"{key} must be one of {', '.join(options)}, got {params[key]!r}")


# ---- expression checks: against empty tables with the store's schemas ----------------------------------
_schema_con: duckdb.DuckDBPyConnection | None = None


def _schema_db() -> duckdb.DuckDBPyConnection:
    global _schema_con
    if _schema_con is None:
        _schema_con = duckdb.connect()
        for name in ("episodes", "turns"):
            _schema_con.execute(TABLES[name].ddl("memory"))
    return _schema_con


def check_sql(expr: str, table: str, what: str) -> None:
    """Fail with DuckDB's explanation when `expr` is not a valid scalar expression over `table`."""
    if not isinstance(expr, str) or not expr.strip():
        raise TrajlakeError(f"{what} must be a non-empty SQL expression")
    extra = ", NULL::VARCHAR AS prev_observation" if table == "turns" else ""
    try:
        _schema_db().execute(f"SELECT CAST(({expr}) AS DOUBLE) FROM (SELECT *{extra} FROM {table}) LIMIT 0")
    except duckdb.Error as e:
        msg = str(e).strip().splitlines()[0]
        raise TrajlakeError(f"{what} {expr!r} is not valid over {table} columns: {msg}") from None


def check_regex(pattern: Any) -> None:
    if not isinstance(pattern, str) or not pattern:
        raise TrajlakeError("pattern must be a non-empty regular expression")
    try:
        re.compile(pattern)
        _schema_db().execute("SELECT regexp_matches('', ?)", [pattern])
    except (re.error, duckdb.Error) as e:
        raise TrajlakeError(f"bad regex {pattern!r}: {str(e).strip().splitlines()[0]}") from None


def load_function(ref: Any) -> Callable:
    """Import `module:function`."""
    if not isinstance(ref, str) or ":" not in ref:
        raise TrajlakeError(f"function must be 'module:function', got {ref!r}")
    module, _, name = ref.partition(":")
    try:
        fn = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as e:
        raise TrajlakeError(f"cannot import {ref}: {e}") from None
    if not callable(fn):
        raise TrajlakeError(f"{ref} is not callable")
    return fn


def _none(name: str, p: dict) -> dict[str, str]:
    return {}


# ---- goal --------------------------------------------------------------------------------------------
def _goal_check(p):
    for k in ("success", "failure"):
        _num(p[k])


register(ComponentKind(
    "goal",
    "OpenManus-RL's GoalReward: `success` (1.0) for a successful episode, `failure` (-1.0) for one that "
    "finished unsuccessfully, otherwise (truncated, error, unknown outcome) the env's score of the last turn "
    "(info.score), else its summed env reward, else 0.",
    {"success": 1.0, "failure": -1.0},
    _goal_check,
    _none,
    # arg_max_null: the last turn's info even when it is NULL (arg_max would skip to an earlier turn's); its
    # JSON is parsed once per episode, not once per turn
    lambda n, p: {f"{n}__score": "TRY_CAST(json_extract(arg_max_null(info, turn), '$.score') AS DOUBLE)"},
    lambda n, p: (f"CASE WHEN ep.success THEN {_num(p['success'])} "
                  f"WHEN ep.status = 'ok' AND ep.success = false THEN {_num(p['failure'])} "
                  f"ELSE coalesce(agg.{n}__score, ep.env_reward, 0) END"),
))


# ---- length_penalty ----------------------------------------------------------------------------------
def _length_check(p):
    _choice(p, "unit", ("tokens", "chars"))
    _choice(p, "scope", ("last", "episode"))
    _choice(p, "shape", ("linear", "quadratic", "log"))
    if p["max"] is None and p["min"] is None:
        raise TrajlakeError("length_penalty needs max and/or min")
    for k in ("max", "min"):
        if p[k] is not None and (not isinstance(p[k], int) or p[k] < 0):
            raise TrajlakeError(f"{k} must be a non-negative integer, got {p[k]!r}")
    _num(p["scale"])


def _length_value(n, p):
    length = f"coalesce(agg.{n}__len, 0)"
    excess = " + ".join(
        [f"greatest({length} - {p['max']}, 0)"] * (p["max"] is not None)
        + [f"greatest({p['min']} - {length}, 0)"] * (p["min"] is not None)
    )
    shaped = {"linear": f"({excess})", "quadratic": f"pow({excess}, 2)", "log": f"ln(1 + ({excess}))"}[p["shape"]]
    return f"-{_num(p['scale'])} * {shaped}"


register(ComponentKind(
    "length_penalty",
    "Penalty -scale * f(excess) for replies longer than `max` or shorter than `min`, in `unit` tokens "
    "(agent tokens) or chars, over the `scope` last reply or the whole episode; f is the `shape`: linear "
    "(x), quadratic (x^2) or log (ln(1+x)).",
    {"unit": "tokens", "scope": "last", "max": None, "min": None, "shape": "linear", "scale": 0.01},
    _length_check,
    _none,
    lambda n, p: {f"{n}__len": ("arg_max" if p["scope"] == "last" else "sum")
                  + ("(num_response_tokens" if p["unit"] == "tokens"
                     else "(length(coalesce(action_text, ''))")
                  + (", turn)" if p["scope"] == "last" else ")")},
    _length_value,
))


# ---- format ------------------------------------------------------------------------------------------
def _format_check(p):
    check_regex(p["pattern"])
    _choice(p, "over", ("each", "last"))


def _match(p) -> str:
    return f"CASE WHEN regexp_matches(coalesce(action_text, ''), {sql_str(p['pattern'])}) THEN 1.0 ELSE 0.0 END"


register(ComponentKind(
    "format",
    "Regex `pattern` searched in the replies (RE2 syntax, as DuckDB's regexp_matches): the fraction of "
    "replies that match (`over = \"each\"`) or 1/0 for the last reply (`over = \"last\"`).",
    {"pattern": None, "over": "each"},
    _format_check,
    _none,
    lambda n, p: {f"{n}__v": (f"avg({_match(p)})" if p["over"] == "each" else f"arg_max({_match(p)}, turn)")},
    lambda n, p: f"coalesce(agg.{n}__v, 0)",
))


# ---- env_reward --------------------------------------------------------------------------------------
def _env_check(p):
    g = p["discount"]
    if not isinstance(g, (int, float)) or not 0 < g <= 1:
        raise TrajlakeError(f"discount must be in (0, 1], got {g!r}")
    for k in ("clip_min", "clip_max"):
        if p[k] is not None:
            _num(p[k])


def _env_value(n, p):
    v = f"coalesce(agg.{n}__sum, 0)"
    if p["clip_min"] is not None:
        v = f"greatest({v}, {_num(p['clip_min'])})"
    if p["clip_max"] is not None:
        v = f"least({v}, {_num(p['clip_max'])})"
    return v


register(ComponentKind(
    "env_reward",
    "Sum of the per-step env rewards, discounted by `discount` per turn (1.0: plain sum), clipped to "
    "[clip_min, clip_max] when given.",
    {"discount": 1.0, "clip_min": None, "clip_max": None},
    _env_check,
    _none,
    lambda n, p: {f"{n}__sum": f"sum(coalesce(step_reward, 0) * pow({_num(p['discount'])}, turn))"},
    _env_value,
))


# ---- process -----------------------------------------------------------------------------------------
SIGNALS = {
    "format_ok": "coalesce(format_ok, false)",
    # JSON true only: TRY_CAST would also read the strings "yes", "true", "1" and the number 1 as true
    "valid_action": "coalesce(CAST(json_extract(info, '$.valid') AS VARCHAR) = 'true', false)",
    # the first turn (not: any turn after a NULL observation) always counts as new
    "new_observation": "(lag(turn) OVER (PARTITION BY episode_id ORDER BY turn) IS NULL "
                       "OR observation IS DISTINCT FROM prev_observation)",
    "positive_step": "coalesce(step_reward, 0) > 0",
}


def _process_check(p):
    if (p["signal"] is None) == (p["expr"] is None):
        raise TrajlakeError(f"process needs exactly one of signal ({', '.join(SIGNALS)}) or expr")
    if p["signal"] is not None and p["signal"] not in SIGNALS:
        raise TrajlakeError(f"unknown signal {p['signal']!r}; valid: {', '.join(SIGNALS)}")
    if p["expr"] is not None:
        check_sql(p["expr"], "turns", "process expr")
    _num(p["reward"])
    _num(p["penalty"])


def process_turn_sql(p: dict) -> str:
    """A process component's per-turn value."""
    if p["expr"] is not None:
        return f"CAST(({p['expr']}) AS DOUBLE)"
    return f"CASE WHEN {SIGNALS[p['signal']]} THEN {_num(p['reward'])} ELSE {_num(p['penalty'])} END"


register(ComponentKind(
    "process",
    "Per-turn rewards that stay attached to their turn (allocated to it by `per_turn`): a named `signal` "
    "(format_ok, valid_action, new_observation, positive_step) giving `reward` when true and `penalty` "
    "when false, or any SQL `expr` over turns columns. The episode's value is the sum over its turns.",
    {"signal": None, "expr": None, "reward": 1.0, "penalty": 0.0},
    _process_check,
    lambda n, p: {f"p_{n}": process_turn_sql(p)},
    lambda n, p: {f"{n}__sum": f"sum(p_{n})"},
    lambda n, p: f"coalesce(agg.{n}__sum, 0)",
))


# ---- sql ---------------------------------------------------------------------------------------------
register(ComponentKind(
    "sql",
    "Any SQL expression `expr` over episodes columns (e.g. \"num_turns * 0.1\").",
    {"expr": None},
    lambda p: check_sql(p["expr"], "episodes", "expr"),
    _none,
    lambda n, p: {},
    lambda n, p: f"CAST(({p['expr']}) AS DOUBLE)",
))


# ---- python ------------------------------------------------------------------------------------------
register(ComponentKind(
    "python",
    "A `function = \"module:function\"` called with a pyarrow Table (one row per episode: episodes columns "
    "plus lists over its turns: action_texts, observations, step_rewards, format_oks, agent_tokens) and "
    "returning one float per row (a list, numpy or Arrow array).",
    {"function": None},
    lambda p: load_function(p["function"]),
    _none,
    lambda n, p: {},
    lambda n, p: f"py_{n}.value",
))
