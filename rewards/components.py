"""Reward component kinds: each validates its parameters and compiles to SQL.

A kind contributes (a) per-turn columns computed over `turns` (process rewards), (b) per-episode
aggregates over those turns, and (c) one episode-level expression over `episodes` columns and its
aggregates. `compile.py` assembles every component of a spec into one query. A kind whose values are
computed outside SQL (python) declares `compute`: `score` runs it on an Arrow table of the episodes and the
query joins its result. Every kind is one `ComponentKind` registered in `KINDS`; compile.py and score.py ask
its hooks, never its name.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from trajlake.core.errors import TrajlakeError
from trajlake.core.registry import Registry
from trajlake.core.sql_text import sql_str
from trajlake.rewards.expr_checks import check_regex, check_sql


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
    #: spec's normalised content at that value, so the ids of specs that do not use them stay the same
    legacy: dict[str, Any] = field(default_factory=dict)
    #: whether its turn columns are per-turn rewards (the `per_turn` allocation places them on their turn)
    per_turn: bool = False
    #: whether its turn columns read `prev_observation` (a window over every turn, so computed only if asked)
    reads_prev_observation: Callable[[dict], bool] = lambda p: False
    #: values computed outside SQL: (name, params, episodes Arrow table) -> one float per row; the query then
    #: reads them as `py_<name>.value`
    compute: Callable[[str, dict, Any], Any] | None = None


#: every component kind, by name (a duplicate is refused; an unknown name lists the valid ones)
KINDS: Registry[ComponentKind] = Registry("component kind")


def register(kind: ComponentKind) -> ComponentKind:
    return KINDS.add(kind.kind, kind)


def kinds() -> list[str]:
    return KINDS.names()


def get_kind(kind: str | None) -> ComponentKind:
    return KINDS[kind]


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


def normalised_params(kind: str, params: dict[str, Any]) -> dict[str, Any]:
    """The params a spec id hashes: all of them, less added ones left at the value that keeps the old meaning."""
    legacy = get_kind(kind).legacy
    return {k: v for k, v in params.items() if not (k in legacy and v == legacy[k] and type(v) is type(legacy[k]))}




def _num(v: Any) -> str:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise TrajlakeError(f"expected a finite number, got {v!r}")
    return repr(float(v))


def _choice(params: dict, key: str, options: tuple[str, ...]) -> None:
    if params[key] not in options:
        raise TrajlakeError(f"{key} must be one of {', '.join(options)}, got {params[key]!r}")


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
GOAL_MODES = ("episode", "openmanus")


GOAL_TRUNCATED = ("score", "failure")


def _goal_check(p):
    _choice(p, "mode", GOAL_MODES)
    for k in ("success", "failure"):
        _num(p[k])
    _choice(p, "truncated", GOAL_TRUNCATED)
    if p["truncated"] == "failure" and p["mode"] != "episode":
        raise TrajlakeError('truncated = "failure" needs mode = "episode" (mode "openmanus" scores a rollout '
                            "that did not finish 0, as OpenManus-RL does)")


def _goal_aggregates(n, p):
    # arg_max_null: the last turn's value even when it is NULL (arg_max would skip to an earlier turn's); its
    # JSON is parsed once per episode, not once per turn
    if p["mode"] == "episode":
        return {f"{n}__score": "TRY_CAST(json_extract(arg_max_null(info, turn), '$.score') AS DOUBLE)"}
    return {f"{n}__info": "arg_max_null(info, turn)", f"{n}__done": "arg_max_null(done, turn)"}


def json_true(json_sql: str, key: str) -> str:
    """Whether `key` of a JSON object is JSON true (not the string "true", not the number 1)."""
    return f"coalesce(CAST(json_extract({json_sql}, '$.{key}') AS VARCHAR) = 'true', false)"


def openmanus_score_sql(info: str) -> str:
    """Python's float(info.get('score', 0.0)), 0 where it raises: DuckDB's cast of a JSON value reads numbers,
    numeric strings and booleans (1/0) as float() does, and gives NULL for null, lists and objects."""
    return f"coalesce(TRY_CAST(json_extract({info}, '$.score') AS DOUBLE), 0.0)"


def _goal_value(n, p):
    if p["mode"] == "episode":
        # truncated = "failure": an episode cut at its step cap is a failure like a lost one, so stalling until
        # the cap never scores above trying and losing
        cut = f"WHEN ep.status = 'truncated' THEN {_num(p['failure'])} " if p["truncated"] == "failure" else ""
        return (f"CASE WHEN ep.success THEN {_num(p['success'])} "
                f"WHEN ep.status = 'ok' AND ep.success = false THEN {_num(p['failure'])} {cut}"
                f"ELSE coalesce(agg.{n}__score, ep.env_reward, 0) END")
    info = f"agg.{n}__info"
    return (f"CASE WHEN NOT coalesce(agg.{n}__done, false) THEN 0.0 "
            f"WHEN {json_true(info, 'success')} THEN {_num(p['success'])} "
            f"WHEN {json_true(info, 'fail')} THEN {_num(p['failure'])} "
            f"ELSE {openmanus_score_sql(info)} END")


register(ComponentKind(
    kind="goal",
    doc="The episode's outcome. mode = \"episode\" (the default, trajlake's rule over the episode's outcome "
    "columns): `success` (1.0) when episodes.success is true; `failure` (-1.0) when the episode finished "
    "(status 'ok') with success false; otherwise (truncated, error, or an unknown outcome) the last turn's "
    "info.score when it reads as a number, else episodes.env_reward (the summed step rewards), else 0. "
    "mode = \"openmanus\" (OpenManus-RL's GoalReward, verl/utils/reward_score/reward_components.py): only the "
    "last turn is read, and only if it ended the episode (done; a truncated or failed rollout gets 0): "
    "`success` when its info.success is JSON true, else `failure` when info.fail is JSON true, else "
    "info.score (a number, a numeric string, or a boolean as 1/0), else 0; episodes.success, status and "
    "env_reward are not read.",
    defaults={"success": 1.0, "failure": -1.0, "mode": "episode", "truncated": "score"},
    check=_goal_check,
    turn_columns=_none,
    aggregates=_goal_aggregates,
    value=_goal_value,
    legacy={"mode": "episode", "truncated": "score"},
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
    kind="length_penalty",
    doc="Penalty -scale * f(excess) for replies longer than `max` or shorter than `min`, in `unit` tokens "
    "(agent tokens) or chars (characters of the reply text, as Python's len), over the `scope` last reply or "
    "the whole episode; f is the `shape`, on both sides: linear (x), quadratic (x^2) or log (ln(1+x)). "
    "OpenManus-RL's LengthPenalty is unit chars, scope last, its -weight as scale; it shapes only the long "
    "side and penalises a short reply only when linear, so the two agree for shape linear (its default).",
    defaults={"unit": "tokens", "scope": "last", "max": None, "min": None, "shape": "linear", "scale": 0.01},
    check=_length_check,
    turn_columns=_none,
    aggregates=lambda n, p: {f"{n}__len": ("arg_max" if p["scope"] == "last" else "sum")
                  + ("(num_response_tokens" if p["unit"] == "tokens"
                     else "(length(coalesce(action_text, ''))")
                  + (", turn)" if p["scope"] == "last" else ")")},
    value=_length_value,
))


# ---- format ------------------------------------------------------------------------------------------
def _format_check(p):
    if not isinstance(p["dotall"], bool):
        raise TrajlakeError(f"dotall must be true or false, got {p['dotall']!r}")
    if p["pattern"] is None:
        if p["dotall"]:
            raise TrajlakeError("dotall needs a pattern (without one, format reads the template's format_ok flag)")
    else:
        check_regex(p["pattern"])
    _choice(p, "over", ("each", "last"))
    envs = p["envs"]
    if envs is not None and (not isinstance(envs, list) or not envs
                             or not all(isinstance(e, str) and e for e in envs)):
        raise TrajlakeError(f"envs must be a non-empty list of env names, got {envs!r}")


def _format_hit(p) -> str:
    """1.0 / 0.0 per reply; NULL when the reply's template flag is unknown (read by neither avg nor coalesce)."""
    if p["pattern"] is None:
        return "CAST(format_ok AS DOUBLE)"
    # option 's': `.` matches newlines too, as Python's re.DOTALL
    flags = ", 's'" if p["dotall"] else ""
    return f"CASE WHEN regexp_matches(coalesce(action_text, ''), {sql_str(p['pattern'])}{flags}) THEN 1.0 ELSE 0.0 END"


def _format_value(n, p):
    v = f"coalesce(agg.{n}__v, 0)"
    if p["envs"] is not None:
        v = f"CASE WHEN ep.env IN ({', '.join(sql_str(e) for e in p['envs'])}) THEN {v} ELSE 0.0 END"
    return v


register(ComponentKind(
    kind="format",
    doc="Whether the replies are well formed: without a `pattern`, as the action template the episode was "
    "played (or imported) with judged each reply (turns.format_ok, set by that template's parser); with a "
    "`pattern`, whether that regex is found in the reply (RE2 syntax, as DuckDB's regexp_matches; `dotall = "
    "true` lets `.` match newlines too, as Python's re.DOTALL). The value is the fraction of well-formed "
    "replies (`over = \"each\"`; replies whose format_ok is unknown are not counted) or 1/0 for the last reply "
    "(`over = \"last\"`; unknown: 0). `envs` (a list of env names) limits it to those envs' episodes; "
    "others get 0.",
    defaults={"pattern": None, "dotall": False, "over": "each", "envs": None},
    check=_format_check,
    turn_columns=_none,
    aggregates=lambda n, p: {f"{n}__v": (f"avg({_format_hit(p)})" if p["over"] == "each"
                              else f"arg_max_null({_format_hit(p)}, turn)")},
    value=_format_value,
    legacy={"dotall": False, "envs": None},
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
    kind="env_reward",
    doc="Sum of the per-step env rewards, discounted by `discount` per turn (1.0: plain sum), clipped to "
    "[clip_min, clip_max] when given.",
    defaults={"discount": 1.0, "clip_min": None, "clip_max": None},
    check=_env_check,
    turn_columns=_none,
    aggregates=lambda n, p: {f"{n}__sum": f"sum(coalesce(step_reward, 0) * pow({_num(p['discount'])}, turn))"},
    value=_env_value,
))


# ---- process -----------------------------------------------------------------------------------------
#: Each signal is true, false, or NULL when the turn does not say (an imported turn has no info.valid and no
#: step reward; a hand-written one may lack its format flag or observation).
SIGNALS = {
    "format_ok": "format_ok",
    # JSON true only: TRY_CAST would also read the strings "yes", "true", "1" and the number 1 as true; any
    # other value the env gave (false, "no", 0) is an invalid action, an absent or null one is unknown
    "valid_action": "CASE WHEN coalesce(json_type(info, '$.valid'), 'NULL') = 'NULL' THEN NULL "
                    "ELSE CAST(json_extract(info, '$.valid') AS VARCHAR) = 'true' END",
    # the first turn always counts as new (nothing was seen before it); after it, a NULL observation on
    # either side leaves the question open
    "new_observation": "CASE WHEN lag(turn) OVER (PARTITION BY episode_id ORDER BY turn) IS NULL THEN true "
                       "WHEN observation IS NULL OR prev_observation IS NULL THEN NULL "
                       "ELSE observation <> prev_observation END",
    "positive_step": "step_reward > 0",
    # the regex `pattern` is found in what the turn's action got back (RESULT_OBSERVATION; none stored: unknown)
    "result_matches": "regexp_matches({result}, {pattern})",
}
#: What a turn's action got back from the env: the next turn's observation, or on an episode's last turn the
#: one collect keeps in its info (`final_observation`); NULL where neither is stored (an imported last turn).
RESULT_OBSERVATION = ("coalesce(lead(observation) OVER (PARTITION BY episode_id ORDER BY turn), "
                      "json_extract_string(info, '$.final_observation'))")
UNKNOWN = ("skip", "false")


def _process_check(p):
    if (p["signal"] is None) == (p["expr"] is None):
        raise TrajlakeError(f"process needs exactly one of signal ({', '.join(SIGNALS)}) or expr")
    if p["signal"] is not None and p["signal"] not in SIGNALS:
        raise TrajlakeError(f"unknown signal {p['signal']!r}; valid: {', '.join(SIGNALS)}")
    _choice(p, "unknown", UNKNOWN)
    if (p["signal"] == "result_matches") != (p["pattern"] is not None):
        raise TrajlakeError("signal result_matches needs a pattern (a regex searched for in what the action got "
                            "back, e.g. '^Got '), and pattern goes only with that signal")
    if p["pattern"] is not None:
        check_regex(p["pattern"])
    if p["expr"] is not None:
        if p["unknown"] != "skip":
            raise TrajlakeError("unknown applies to a signal; an expr gives each turn's value itself")
        check_sql(p["expr"], "turns", "process expr")
    _num(p["reward"])
    _num(p["penalty"])


def process_turn_sql(p: dict) -> str:
    """A process component's per-turn value: 0 for a turn whose signal is unknown, unless `unknown = "false"`."""
    if p["expr"] is not None:
        return f"CAST(({p['expr']}\n) AS DOUBLE)"
    signal, reward, penalty = SIGNALS[p["signal"]], _num(p["reward"]), _num(p["penalty"])
    if p["pattern"] is not None:
        signal = signal.format(result=RESULT_OBSERVATION, pattern=sql_str(p["pattern"]))
    if p["unknown"] == "false":
        return f"CASE WHEN coalesce({signal}, false) THEN {reward} ELSE {penalty} END"
    return f"CASE ({signal}) WHEN true THEN {reward} WHEN false THEN {penalty} ELSE 0.0 END"


register(ComponentKind(
    kind="process",
    doc="Per-turn rewards that stay attached to their turn (allocated to it by `per_turn`): a named `signal` "
    "giving `reward` when true and `penalty` when false, or any SQL `expr` over turns columns. Signals: "
    "format_ok (the template's parser read an action), valid_action (info.valid is JSON true; absent or null: "
    "unknown), new_observation (the observation differs from the previous turn's; the first turn's is new), "
    "positive_step (step_reward > 0; NULL: unknown), result_matches (the regex `pattern`, RE2 syntax, is found "
    "in what the turn's action got back: the next turn's observation, or the last turn's info.final_observation; "
    "neither stored: unknown). A turn whose signal is unknown gets neither (0), as "
    "imported turns, which carry no validity flag or step reward; `unknown = \"false\"` counts it as false "
    "instead (the penalty). The episode's value is the sum over its turns.",
    defaults={"signal": None, "expr": None, "reward": 1.0, "penalty": 0.0, "unknown": "skip", "pattern": None},
    check=_process_check,
    turn_columns=lambda n, p: {f"p_{n}": process_turn_sql(p)},
    aggregates=lambda n, p: {f"{n}__sum": f"sum(p_{n})"},
    value=lambda n, p: f"coalesce(agg.{n}__sum, 0)",
    legacy={"pattern": None},
    per_turn=True,
    reads_prev_observation=lambda p: (p.get("signal") == "new_observation"
                                      or "prev_observation" in (p.get("expr") or "").lower()),
))


# ---- sql ---------------------------------------------------------------------------------------------
register(ComponentKind(
    kind="sql",
    doc="Any SQL expression `expr` over episodes columns (e.g. \"num_turns * 0.1\").",
    defaults={"expr": None},
    check=lambda p: check_sql(p["expr"], "episodes", "expr"),
    turn_columns=_none,
    aggregates=lambda n, p: {},
    value=lambda n, p: f"CAST(({p['expr']}\n) AS DOUBLE)",
))


# ---- python ------------------------------------------------------------------------------------------
register(ComponentKind(
    kind="python",
    doc="A `function = \"module:function\"` called with a pyarrow Table (one row per episode: episodes columns "
    "plus lists over its turns: action_texts, observations, step_rewards, format_oks, agent_tokens) and "
    "returning one float per row (a list, numpy or Arrow array).",
    defaults={"function": None},
    check=lambda p: load_function(p["function"]),
    turn_columns=_none,
    aggregates=lambda n, p: {},
    value=lambda n, p: f"py_{n}.value",
    compute=lambda n, p, inputs: _call_python(n, p["function"], inputs),
))


def _call_python(name: str, ref: str, inputs: Any) -> Any:
    """A python component's values: its function on the episodes table, one float per row, checked."""
    import pyarrow as pa

    fn = load_function(ref)
    try:
        values = pa.array(fn(inputs), type=pa.float64())
    except Exception as e:  # user code: report which function failed and how
        raise TrajlakeError(f"python component {name} ({ref}) failed: {e}") from None
    if len(values) != inputs.num_rows:
        raise TrajlakeError(f"python component {name} returned {len(values)} values for {inputs.num_rows} episodes")
    return values
