"""The `goal` kind: the episode's outcome, by trajlake's rule or by OpenManus-RL's GoalReward."""

from __future__ import annotations

from trajlake.core.errors import TrajlakeError
from trajlake.rewards.component_kind import ComponentKind, check_choice, no_columns, sql_number

GOAL_MODES = ("episode", "openmanus")
GOAL_TRUNCATED = ("score", "failure")


def _check(p: dict) -> None:
    check_choice(p, "mode", GOAL_MODES)
    for k in ("success", "failure"):
        sql_number(p[k])
    check_choice(p, "truncated", GOAL_TRUNCATED)
    if p["truncated"] == "failure" and p["mode"] != "episode":
        raise TrajlakeError('truncated = "failure" needs mode = "episode" (mode "openmanus" scores a rollout '
                            "that did not finish 0, as OpenManus-RL does)")


def _aggregates(n: str, p: dict) -> dict[str, str]:
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


def _value(n: str, p: dict) -> str:
    if p["mode"] == "episode":
        # truncated = "failure": an episode cut at its step cap is a failure like a lost one, so stalling until
        # the cap never scores above trying and losing
        cut = f"WHEN ep.status = 'truncated' THEN {sql_number(p['failure'])} " if p["truncated"] == "failure" else ""
        return (f"CASE WHEN ep.success THEN {sql_number(p['success'])} "
                f"WHEN ep.status = 'ok' AND ep.success = false THEN {sql_number(p['failure'])} {cut}"
                f"ELSE coalesce(agg.{n}__score, ep.env_reward, 0) END")
    info = f"agg.{n}__info"
    return (f"CASE WHEN NOT coalesce(agg.{n}__done, false) THEN 0.0 "
            f"WHEN {json_true(info, 'success')} THEN {sql_number(p['success'])} "
            f"WHEN {json_true(info, 'fail')} THEN {sql_number(p['failure'])} "
            f"ELSE {openmanus_score_sql(info)} END")


GOAL = ComponentKind(
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
    check=_check,
    turn_columns=no_columns,
    aggregates=_aggregates,
    value=_value,
    added_later={"mode": "episode", "truncated": "score"},
)
