"""The `process` kind: per-turn rewards that stay attached to their turn, from a named signal or a SQL expr."""

from __future__ import annotations

from trajlake.core.errors import TrajlakeError
from trajlake.core.sql_text import sql_str
from trajlake.rewards.component_kind import ComponentKind, check_choice, sql_number
from trajlake.rewards.expr_checks import check_regex, check_sql

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


def _check(p: dict) -> None:
    if (p["signal"] is None) == (p["expr"] is None):
        raise TrajlakeError(f"process needs exactly one of signal ({', '.join(SIGNALS)}) or expr")
    if p["signal"] is not None and p["signal"] not in SIGNALS:
        raise TrajlakeError(f"unknown signal {p['signal']!r}; valid: {', '.join(SIGNALS)}")
    check_choice(p, "unknown", UNKNOWN)
    if (p["signal"] == "result_matches") != (p["pattern"] is not None):
        raise TrajlakeError("signal result_matches needs a pattern (a regex searched for in what the action got "
                            "back, e.g. '^Got '), and pattern goes only with that signal")
    if p["pattern"] is not None:
        check_regex(p["pattern"])
    if p["expr"] is not None:
        if p["unknown"] != "skip":
            raise TrajlakeError("unknown applies to a signal; an expr gives each turn's value itself")
        check_sql(p["expr"], "turns", "process expr")
    sql_number(p["reward"])
    sql_number(p["penalty"])


def process_turn_sql(p: dict) -> str:
    """A process component's per-turn value: 0 for a turn whose signal is unknown, unless `unknown = "false"`."""
    if p["expr"] is not None:
        return f"CAST(({p['expr']}\n) AS DOUBLE)"
    signal, reward, penalty = SIGNALS[p["signal"]], sql_number(p["reward"]), sql_number(p["penalty"])
    if p["pattern"] is not None:
        signal = signal.format(result=RESULT_OBSERVATION, pattern=sql_str(p["pattern"]))
    if p["unknown"] == "false":
        return f"CASE WHEN coalesce({signal}, false) THEN {reward} ELSE {penalty} END"
    return f"CASE ({signal}) WHEN true THEN {reward} WHEN false THEN {penalty} ELSE 0.0 END"


def _reads_prev_observation(p: dict) -> bool:
    """The new_observation signal compares with the previous turn's observation; an expr may name it."""
    return p.get("signal") == "new_observation" or "prev_observation" in (p.get("expr") or "").lower()


PROCESS = ComponentKind(
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
    check=_check,
    turn_columns=lambda n, p: {f"p_{n}": process_turn_sql(p)},
    aggregates=lambda n, p: {f"{n}__sum": f"sum(p_{n})"},
    value=lambda n, p: f"coalesce(agg.{n}__sum, 0)",
    added_later={"pattern": None},
    per_turn=True,
    reads_prev_observation=_reads_prev_observation,
)
