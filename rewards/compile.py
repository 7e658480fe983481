"""Compile a reward spec to one SQL query over (a pinned snapshot of) the store.

The query selects the episodes to score, computes every component per episode (turn columns -> per
episode aggregates -> one expression each), and returns spec_id, episode_id, total and the components as
a MAP, so `trajlake sql` can explain every total. Python components are computed first on Arrow and join
in as tables named `py_<component>`.
"""

from __future__ import annotations

from trajlake.core.sql_text import sql_str
from trajlake.rewards import allocation
from trajlake.rewards.components import get_kind
from trajlake.rewards.spec import RewardSpec
from trajlake.schemas.allocations import ALLOCATIONS

#: Columns a python component's function receives, besides every episodes column.
PY_INPUT_SQL = """
SELECT ep.*, t.action_texts, t.observations, t.step_rewards, t.format_oks, t.agent_tokens
FROM ep LEFT JOIN (
    SELECT episode_id, list(action_text ORDER BY turn) AS action_texts, list(observation ORDER BY turn) AS observations,
           list(step_reward ORDER BY turn) AS step_rewards, list(format_ok ORDER BY turn) AS format_oks,
           list(num_response_tokens ORDER BY turn) AS agent_tokens
    FROM turns WHERE episode_id IN (SELECT episode_id FROM ep) GROUP BY episode_id
) t USING (episode_id) ORDER BY ep.episode_id
"""


def episodes_cte(spec: RewardSpec, where: str | None, only_new: bool) -> str:
    """The episodes to score: `where` over episodes columns, minus those already scored by this spec."""
    conds = [f"({where}\n)"] if where else []
    if only_new:
        # `lake.episode_rewards` is the latest table even when the query reads a pinned snapshot, so a re-run
        # at any snapshot skips what is already stored.
        conds.append(f"episode_id NOT IN (SELECT episode_id FROM lake.episode_rewards WHERE spec_id = "
                     f"{sql_str(spec.spec_id)})")
    return "SELECT * FROM episodes" + (" WHERE " + " AND ".join(conds) if conds else "")


def turn_columns(spec: RewardSpec) -> dict[str, str]:
    cols: dict[str, str] = {}
    for c in spec.components:
        cols.update(get_kind(c.kind).turn_columns(c.name, c.params))
    return cols


#: The previous turn's observation: a window over every turn, the most expensive part of a query that has it.
PREV_OBSERVATION = ", lag(observation) OVER (PARTITION BY episode_id ORDER BY turn) AS prev_observation"


def needs_prev_observation(spec: RewardSpec) -> bool:
    """Whether a component reads `prev_observation`: the new_observation signal, or an expr naming it."""
    return any(get_kind(c.kind).reads_prev_observation(c.params) for c in spec.components)


def compile_query(spec: RewardSpec, *, where: str | None = None, only_new: bool = True,
                  components: str = "map", spans: bool = False) -> str:
    """The scoring query: one row per episode with spec_id, episode_id, total, components.

    components="map": the components as one MAP column (name -> value); components="columns": one DOUBLE
    column c_<name> per component instead (`score` builds the map in Arrow, where it costs nothing, while
    DuckDB's MAP() checks each row's keys). spans=True: also a `spans` column, the episode's token allocation as
    a list of reward_spans' (turn, position, length, reward), computed from the same turns (rewards/allocation.py),
    and the rows in no order.
    """
    if components not in ("map", "columns"):
        raise ValueError(f"components must be 'map' or 'columns', got {components!r}")
    aggregates: dict[str, str] = {}
    values: dict[str, str] = {}
    py_joins = []
    for c in spec.components:
        kind = get_kind(c.kind)
        aggregates.update(kind.aggregates(c.name, c.params))
        values[c.name] = kind.value(c.name, c.params)
        if kind.compute is not None:  # values computed outside SQL, joined as a table (score.py makes it)
            py_joins.append(f"LEFT JOIN py_{c.name} USING (episode_id)")
    tcols = "".join(f", {sql} AS {alias}" for alias, sql in turn_columns(spec).items())
    # with spans: the turns pass one window (each segment's place) on their way to the aggregates, which also
    # collect the segments; the spans are made from them once the total is known
    reads_process = ALLOCATIONS[spec.allocation.strategy].process
    source, seg_cte, seg_out, spans_out = "tu", "", "", ""
    if spans:
        process = process_reward_sql(spec) if reads_process else None
        tcols += f", {process or 'CAST(0 AS DOUBLE)'} AS seg__process" if reads_process else ""
        seg_cte = (f"seg AS (SELECT *{allocation.segment_columns(reads_process)} FROM tu "
                   f"{allocation.SEGMENT_WINDOW}),\n")
        source = "seg"
        aggregates.update(allocation.segment_aggregates(reads_process))
        seg_out, spans_out = ", agg.seg__agent, agg.seg__list", ", " + allocation.spans_sql(spec)
    agg_sql = ", ".join(f"{sql} AS {alias}" for alias, sql in aggregates.items())
    agg_cte = (f"agg AS (SELECT episode_id, {agg_sql} FROM {source} GROUP BY episode_id)" if aggregates
               else f"agg AS (SELECT DISTINCT episode_id FROM {source})")
    comp_cols = ", ".join(f"CAST({sql} AS DOUBLE) AS c_{name}" for name, sql in values.items())
    total = " + ".join(f"{c.weight!r} * c_{c.name}" for c in spec.components)
    names = ", ".join(sql_str(c.name) for c in spec.components)
    weighted = ", ".join(f"c_{c.name}" for c in spec.components)
    out = f"MAP([{names}], [{weighted}]) AS components" if components == "map" else weighted
    prev = PREV_OBSERVATION if needs_prev_observation(spec) else ""
    # sorting rows that carry their span lists costs a third of the allocation: with spans, `score` sorts the
    # episode rows once the lists are split off (allocation.split_spans)
    order = "" if spans else " ORDER BY episode_id"
    # every episode scored (only_new=False, no where): the turns need no semi-join with them, since a turn
    # without an episode row reaches no result anyway (its aggregates join no row of ep)
    only_ep = " WHERE episode_id IN (SELECT episode_id FROM ep)" if only_new or where else ""
    return f"""
WITH ep AS ({episodes_cte(spec, where, only_new)}),
tu0 AS (SELECT *{prev} FROM turns{only_ep}),
tu AS (SELECT *{tcols} FROM tu0),
{seg_cte}{agg_cte},
vals AS (SELECT ep.episode_id, {comp_cols}{seg_out} FROM ep LEFT JOIN agg USING (episode_id) {' '.join(py_joins)}),
scored AS (SELECT *, {total} AS total FROM vals)
SELECT {sql_str(spec.spec_id)} AS spec_id, episode_id, total, {out}{spans_out}
FROM scored{order}
"""


def process_reward_sql(spec: RewardSpec) -> str | None:
    """A turn's weighted process rewards as one DOUBLE (what turn_rewards stores); None when the spec has none."""
    parts = [(c, get_kind(c.kind).turn_columns(c.name, c.params)) for c in spec.components
             if get_kind(c.kind).per_turn]
    if not parts:
        return None
    return "CAST(" + " + ".join(f"{c.weight!r} * ({sql})" for c, cols in parts for sql in cols.values()) + " AS DOUBLE)"


def turn_rewards_query(spec: RewardSpec, episode_ids_table: str) -> str | None:
    """Per-turn weighted process rewards (for `per_turn` allocation); None when the spec has none."""
    reward = process_reward_sql(spec)
    if reward is None:
        return None
    return f"""
SELECT {sql_str(spec.spec_id)} AS spec_id, episode_id, turn, {reward} AS reward
FROM (SELECT *{PREV_OBSERVATION if needs_prev_observation(spec) else ""}
      FROM turns WHERE episode_id IN (SELECT episode_id FROM {episode_ids_table}))
"""
