"""Scoring stored episodes with a spec (replay), and comparing two specs.

`score` reads a pinned snapshot, runs the compiled query, and stores the results under the spec's id in
one snapshot: the spec (reward_specs), each episode's total and components (episode_rewards), and the
per-turn process rewards (turn_rewards). Episodes already scored by the spec are skipped, so re-running a
spec is a no-op, and a new spec re-scores every old rollout without touching it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from trajlake.core.clock import utc_now
from trajlake.core.errors import TrajlakeError
from trajlake.rewards.allocation import split_spans
from trajlake.rewards.compile import PY_INPUT_SQL, compile_query, episodes_cte, turn_rewards_query
from trajlake.rewards.components import get_kind
from trajlake.rewards.spec import RewardSpec
from trajlake.schemas import RewardSpecRow
from trajlake.store import Lake
from trajlake.store.sql_guard import check_filter, parse_expression


class RewardValueError(TrajlakeError):
    """A component produced NaN or an infinite value."""


@dataclass(frozen=True)
class ScoreResult:
    spec_id: str
    name: str
    read_snapshot: int
    scored: int
    snapshot: int | None  # the snapshot written, None when nothing was new
    #: with `score(..., spans=True)`: the scored episodes' token allocation, reward_spans' rows for them
    spans: pa.Table | None = field(default=None, repr=False, compare=False)

    def __str__(self) -> str:
        wrote = f"wrote snapshot {self.snapshot}" if self.snapshot is not None else "nothing new to store"
        return (f"spec {self.name} ({self.spec_id}): scored {self.scored} episodes read at snapshot "
                f"{self.read_snapshot}; {wrote}")


def _python_tables(lake: Lake, spec: RewardSpec, where: str | None, snapshot: int) -> dict[str, pa.Table]:
    tables = {}
    comps = [c for c in spec.components if get_kind(c.kind).compute is not None]
    if not comps:
        return tables
    inputs = lake.query(f"WITH ep AS ({episodes_cte(spec, where, True)}) {PY_INPUT_SQL}", snapshot=snapshot,
                        output="arrow")
    for c in comps:
        values = get_kind(c.kind).compute(c.name, c.params, inputs)
        tables[f"py_{c.name}"] = pa.table({"episode_id": inputs["episode_id"], "value": values})
    return tables


def with_components_map(result: pa.Table, spec: RewardSpec) -> pa.Table:
    """(spec_id, episode_id, total, c_<name>...) -> (spec_id, episode_id, total, components MAP), built in Arrow.

    The map of row i holds its components in spec order: the values are the c_ columns interleaved by row, with
    numpy when none is NULL, else by a take over their concatenation (so NULLs stay NULL).
    """
    names = [c.name for c in spec.components]
    rows, k = result.num_rows, len(names)
    cols = [result[f"c_{n}"].combine_chunks().cast(pa.float64()) for n in names]
    if rows and not any(c.null_count for c in cols):
        items = pa.array(np.column_stack([c.to_numpy() for c in cols]).ravel())
    else:
        order = (np.arange(rows)[:, None] + np.arange(k)[None, :] * rows).ravel()
        items = pa.concat_arrays(cols).take(pa.array(order))
    keys = pa.array(names, pa.string()).take(pa.array(np.tile(np.arange(k), rows)))
    offsets = pa.array(np.arange(0, rows * k + 1, k, dtype=np.int32))
    components = pa.MapArray.from_arrays(offsets, keys, items)
    return pa.table({"spec_id": result["spec_id"], "episode_id": result["episode_id"], "total": result["total"],
                     "components": components})


def check_finite(result: pa.Table, spec: RewardSpec) -> None:
    """NaN or infinite rewards are an error naming the episode and the component."""
    total = result["total"]
    bad = pc.or_(pc.is_nan(total), pc.is_inf(total)) if len(total) else pa.array([], pa.bool_())
    bad = pc.fill_null(bad, False)
    if not pc.any(bad).as_py():
        nulls = pc.is_null(total)
        if len(total) and pc.any(nulls).as_py():
            row = pc.index(nulls, True).as_py()
            comps = dict(result["components"][row].as_py())
            name = next((k for k, v in comps.items() if v is None), "?")
            raise RewardValueError(f"episode {result['episode_id'][row]}: component {name} is NULL")
        return
    row = pc.index(bad, True).as_py()
    comps = dict(result["components"][row].as_py())
    name = next((k for k, v in comps.items() if v is None or not math.isfinite(v)), "total")
    raise RewardValueError(f"episode {result['episode_id'][row]}: component {name} of spec {spec.name} is "
                           f"{comps.get(name, total[row].as_py())} (not finite)")


def check_turns_finite(turn: pa.Table, spec: RewardSpec) -> None:
    """NaN or infinite process rewards (turn_rewards) are an error naming the episode, the turn and the spec's
    per-turn components: an episode's total can be finite while one of its turns is not (a component whose
    episode value does not sum its turns)."""
    bad = pc.fill_null(pc.invert(pc.is_finite(turn["reward"])), False)
    if not len(bad) or not pc.any(bad).as_py():
        return
    row = pc.index(bad, True).as_py()
    names = ", ".join(c.name for c in spec.components if get_kind(c.kind).per_turn)
    raise RewardValueError(f"episode {turn['episode_id'][row]} turn {turn['turn'][row]}: the process reward of "
                           f"spec {spec.name} is {turn['reward'][row].as_py()} (not finite), from its per-turn "
                           f"component(s) {names}")


def check_where(where: str | None) -> None:
    """Refuse a `where` that is not one SQL expression: it is pasted into queries, and a `)` or `;` in it could
    end the expression and run SQL of its own."""
    if where is None:
        return
    try:
        parse_expression(where, "--where")  # DuckDB's parse, nesting past MAX_DEPTH refused first
    except duckdb.Error as e:
        raise TrajlakeError(f"--where {where!r} is not one SQL expression over episodes columns: "
                            f"{str(e).strip().splitlines()[0]}") from None
    check_filter(where, "--where")  # and it runs on the connection that writes: no table or catalog function


def score(lake: Lake, spec: RewardSpec, *, snapshot: int | None = None, where: str | None = None,
          run_id: str | None = None, spans: bool = False) -> ScoreResult:
    """Score the episodes matching `where` at `snapshot` (default: latest) and store the results.

    spans=True: also return their token allocation (`ScoreResult.spans`, the rows `reward_spans` gives for them
    once stored), computed by the scoring query from the turns it reads anyway (rewards/allocation.py) instead
    of a second pass over the turns through the view."""
    check_where(where)
    snap = lake.current_snapshot() if snapshot is None else snapshot
    tables = _python_tables(lake, spec, where, snap)
    # a spec with nothing stored yet (re-scoring every rollout under a new spec) skips the anti-join with what it
    # stored and the semi-join of the turns with the episodes left: a sixth of the query; rows another writer
    # stores meanwhile are skipped by the append's key check
    stored = lake.query("SELECT count(*) AS n FROM episode_rewards WHERE spec_id = ?", [spec.spec_id],
                        output="arrow")["n"][0].as_py()
    query = compile_query(spec, where=where, only_new=stored > 0, components="columns", spans=spans)
    result = lake.query(query, snapshot=snap, output="arrow", tables=tables)
    allocated = None
    if spans:
        result, allocated = split_spans(result, spec.spec_id)
    result = with_components_map(result, spec)
    check_finite(result, spec)
    rows: dict[str, object] = {
        "reward_specs": [RewardSpecRow(spec.spec_id, spec.name, spec.to_json(), utc_now())],
        "episode_rewards": result,
    }
    tr_sql = turn_rewards_query(spec, "scored")
    if tr_sql and result.num_rows:
        turn = lake.query(tr_sql, snapshot=snap, output="arrow", tables={"scored": result.select(["episode_id"])})
        check_turns_finite(turn, spec)
        rows["turn_rewards"] = turn.filter(pc.not_equal(turn["reward"], 0.0))
    commit = lake.append(rows, stage="rewards", run_id=run_id,
                         message=f"rewards: {spec.name} ({spec.spec_id}) over snapshot {snap}: "
                                 f"{result.num_rows} episodes")
    return ScoreResult(spec.spec_id, spec.name, snap, result.num_rows, commit.snapshot_id, allocated)


DIFF_SQL = """
SELECT a.episode_id, e.env, e.task_id, e.success, a.total AS total_a, b.total AS total_b,
       b.total - a.total AS delta
FROM episode_rewards a JOIN episode_rewards b USING (episode_id) JOIN episodes e USING (episode_id)
WHERE a.spec_id = ? AND b.spec_id = ? AND {filter}
"""

DIFF_SUMMARY_SQL = """
WITH d AS ({diff})
SELECT count(*) AS episodes,
       round(avg(total_a), 4) AS mean_a, round(avg(total_b), 4) AS mean_b, round(avg(delta), 4) AS mean_delta,
       round(avg(total_a) FILTER (WHERE success), 4) AS mean_a_success,
       round(avg(total_b) FILTER (WHERE success), 4) AS mean_b_success,
       round(avg(total_a) FILTER (WHERE NOT success), 4) AS mean_a_failure,
       round(avg(total_b) FILTER (WHERE NOT success), 4) AS mean_b_failure,
       round(corr(total_a, total_b), 4) AS correlation,
       count(*) FILTER (WHERE abs(delta) > 1e-12) AS changed
FROM d
"""


def diff(lake: Lake, a: RewardSpec, b: RewardSpec, *, snapshot: int | None = None, where: str | None = None,
         top: int = 10):
    """Score both specs (storing what is new) and compare them: (summary, top changed episodes)."""
    score(lake, a, snapshot=snapshot, where=where)
    score(lake, b, snapshot=snapshot, where=where)
    snap = lake.current_snapshot() if snapshot is None else int(snapshot)
    # the episodes compared are those the specs were asked to score: at the snapshot, matching `where`
    scope = f"SELECT episode_id FROM lake.episodes AT (VERSION => {snap})" + (f" WHERE ({where}\n)" if where else "")
    pairs = DIFF_SQL.format(filter=f"e.episode_id IN ({scope})")
    params = [a.spec_id, b.spec_id]
    summary = lake.query(DIFF_SUMMARY_SQL.format(diff=pairs), params)
    changes = lake.query(f"SELECT * FROM ({pairs}) ORDER BY abs(delta) DESC, episode_id LIMIT {int(top)}", params)
    return summary, changes
