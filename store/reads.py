"""The reads other stages make of stored data, typed: what a train step, an export, a collect summary and the
viewer read again and again, each in one place with its columns documented. Every function takes a `Lake`; those
with `snapshot` read the lake as it was then (None: as it is now).

Raw SQL stays the public analysis surface (`Lake.query`, `trajlake sql`, docs/queries): these functions are the
store's answers to the questions its own stages ask, not a replacement for it.

Episodes that ended in an env error (status `error`: a dead env server cut them short) say nothing about the
policy: the training reads and the collect summary leave them out, as said at each.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import duckdb
import polars as pl
import pyarrow as pa

from trajlake.core.errors import SnapshotError, TrajlakeError
from trajlake.store.sql_guard import UnsafeSQLError, check_filter, parse_expression

if TYPE_CHECKING:
    from trajlake.store.lake import Lake

# ---- training sequences ------------------------------------------------------------------------------------

#: episodes a SQL filter `{where}` selects, never those that ended in an env error
_SELECTED = "SELECT * FROM episodes WHERE ({where}\n) AND status IS DISTINCT FROM 'error'"

COUNT_SQL = "SELECT count(*) AS n FROM episodes WHERE ({where}\n) AND status IS DISTINCT FROM 'error'"

TRAINING_SQL = f"""
WITH ep AS ({_SELECTED})
SELECT ep.episode_id, ep.group_id, ep.task_id, ep.policy_id, coalesce(ep.success, false) AS success,
       t.turn, t.observation, t.prompt_token_ids, t.response_token_ids, t.response_logprobs
FROM ep JOIN turns t USING (episode_id)
ORDER BY ep.episode_id, t.turn
"""

#: with a spec: the same rows plus each episode's total and reward spans (lists, repeated on each of its
#: turns), in one query (one pinned read)
SCORED_TRAINING_SQL = f"""
WITH ep AS MATERIALIZED ({_SELECTED}),
tot AS (SELECT episode_id, total FROM episode_rewards WHERE spec_id = ? AND episode_id IN (SELECT episode_id FROM ep)),
rw AS (SELECT episode_id, list(position) AS positions, list(length) AS lengths, list(reward) AS rewards
       FROM reward_spans WHERE spec_id = ? AND episode_id IN (SELECT episode_id FROM ep) GROUP BY episode_id)
SELECT ep.episode_id, ep.group_id, ep.task_id, ep.policy_id, coalesce(ep.success, false) AS success,
       t.turn, t.observation, t.prompt_token_ids, t.response_token_ids, t.response_logprobs,
       tot.episode_id IS NOT NULL AS scored, tot.total, rw.positions, rw.lengths, rw.rewards
FROM ep JOIN turns t USING (episode_id) LEFT JOIN tot USING (episode_id) LEFT JOIN rw USING (episode_id)
ORDER BY ep.episode_id, t.turn
"""


class EpisodeFilterError(TrajlakeError):
    """A filter over episodes (a config field's, a command option's) that is not one SQL expression over
    episodes columns; the message names whose filter it is and why."""


def count_episodes(lake: Lake, where: str, *, snapshot: int | None = None) -> int:
    """How many episodes the SQL filter `where` (over episodes columns) selects at `snapshot`, never counting
    those that ended in an env error. `where` is pasted into the query as it is: `check_episode_filter`
    checks it first."""
    return int(lake.query(COUNT_SQL.format(where=where), snapshot=snapshot)["n"][0])


def check_episode_filter(lake: Lake, where: str, *, what: str, snapshot: int | None = None) -> int:
    """`count_episodes`, once `where` (the filter of `what`, e.g. "train config: sft_filter") is known to be
    one SQL expression over episodes columns. Raises EpisodeFilterError naming `what`, reading nothing else, on a
    syntax error, a column episodes lacks, or a `;` that would run a statement of its own (the filter is pasted
    into queries, and DuckDB runs every statement it is given); SnapshotError for a snapshot the lake lacks."""

    def refuse(reason: str) -> EpisodeFilterError:
        return EpisodeFilterError(f"{what} {where!r} is not a SQL filter over episodes columns: {reason}")

    try:
        parse_expression(where, what)  # parses one expression (nested at most MAX_DEPTH deep), or raises
    except duckdb.Error as e:
        raise refuse(str(e).strip().splitlines()[0]) from None
    except UnsafeSQLError as e:
        raise EpisodeFilterError(str(e)) from None
    try:  # the filter runs on the connection that writes: no table function, catalog function or other table
        check_filter(where, what)
    except UnsafeSQLError as e:
        raise EpisodeFilterError(str(e)) from None
    try:
        return count_episodes(lake, where, snapshot=snapshot)
    except SnapshotError:
        raise
    except TrajlakeError as e:
        raise refuse(str(e).removeprefix("query failed: ")) from None


def training_turns(lake: Lake, where: str, *, snapshot: int, spec_id: str | None = None) -> pa.Table:
    """One row per turn of every episode `where` selects at `snapshot` (never those that ended in an env
    error), in (episode_id, turn) order: the stored token ids a training sequence is rebuilt from.

    Columns: episode_id, group_id, task_id, policy_id (str), success (bool, false when unknown), turn (int),
    observation (str), prompt_token_ids, response_token_ids (list[int]), response_logprobs (list[float] or null).
    With `spec_id`, also: scored (bool: the spec scored the episode), total (float, the episode's total
    reward), and its `reward_spans` as three parallel lists, positions, lengths (list[int]) and rewards
    (list[float]), the same on every turn of an episode (null when the spec allocated nothing to it).
    Arrow, not polars: token lists are read in bulk and go straight to Python lists."""
    if spec_id is None:
        return lake.query(TRAINING_SQL.format(where=where), snapshot=snapshot, output="arrow")
    return lake.query(SCORED_TRAINING_SQL.format(where=where), [spec_id, spec_id], snapshot=snapshot,
                      output="arrow")


# ---- scored episodes ---------------------------------------------------------------------------------------

EPISODE_REWARDS_SQL = """
SELECT r.episode_id, r.total, list({{'position': k.position, 'reward': k.reward}}) AS tokens
FROM episode_rewards r LEFT JOIN token_rewards k USING (spec_id, episode_id)
WHERE r.spec_id = ? AND r.episode_id IN (SELECT episode_id FROM episodes WHERE ({where}\n))
GROUP BY r.episode_id, r.total
"""


def episode_rewards(lake: Lake, spec_id: str, where: str, *, snapshot: int | None = None) -> pa.Table:
    """The rewards spec `spec_id` gave the episodes `where` selects (env errors included), one row per scored
    episode (unscored ones have none), in no set order.

    Columns: episode_id (str), total (float, the episode's total reward), tokens (list of {position: int,
    reward: float}: its non-zero per-token rewards, the `token_rewards` view; one entry with null fields when
    it has none)."""
    return lake.query(EPISODE_REWARDS_SQL.format(where=where), [spec_id], snapshot=snapshot, output="arrow")


def stored_episode_ids(lake: Lake, ids: Iterable[str] | None = None) -> set[str]:
    """The episode ids the lake holds now: of `ids` (None: all of them)."""
    if ids is None:
        return set(lake.query("SELECT episode_id FROM episodes")["episode_id"].to_list())
    found = lake.query("SELECT episode_id FROM episodes WHERE episode_id IN (SELECT unnest(?::VARCHAR[]))",
                       [list(ids)])
    return set(found["episode_id"].to_list())


# ---- a collect run -----------------------------------------------------------------------------------------

#: per (task, sample) of a run: whether any of its episodes ended without an env error (ok or truncated)
PAIRS_SQL = """
SELECT count(*) AS pairs, count(*) FILTER (WHERE NOT played) AS errored,
       min(last_error) FILTER (WHERE NOT played) AS example
FROM (SELECT task_id, sample_index, bool_or(status IS DISTINCT FROM 'error') AS played, max(error) AS last_error
      FROM episodes WHERE run_id = ? GROUP BY task_id, sample_index)
"""
#: the longest example error `run_errors` keeps (cut with "...")
EXAMPLE_CHARS = 200


@dataclass(frozen=True)
class RunErrors:
    """A run's (task, sample) pairs, how many of them have only env-error episodes (to retry), and one error."""

    pairs: int
    errored: int
    example: str | None = None


def run_errors(lake: Lake, run_id: str) -> RunErrors:
    """The env errors of run `run_id` now: its pairs, those with no episode but env errors, and the first (in
    text order) of those pairs' last errors, cut to EXAMPLE_CHARS."""
    row = lake.query(PAIRS_SQL, [run_id]).row(0, named=True)
    example = row["example"]
    if example is not None and len(example) > EXAMPLE_CHARS:
        example = example[:EXAMPLE_CHARS - 3] + "..."
    return RunErrors(int(row["pairs"] or 0), int(row["errored"] or 0), example)


COLLECT_SUMMARY_SQL = """
WITH e AS (
    SELECT *, status IS DISTINCT FROM 'error' AS played,
           bool_or(status IS DISTINCT FROM 'error') OVER (PARTITION BY task_id, sample_index) AS pair_played
    FROM episodes WHERE run_id = ?
)
SELECT e.env, count(*) FILTER (WHERE e.played) AS episodes,
       round(avg(e.success::INT) FILTER (WHERE e.played), 3) AS success_rate,
       round(avg(e.num_turns) FILTER (WHERE e.played), 2) AS mean_turns,
       round(avg(e.env_reward) FILTER (WHERE e.played), 3) AS mean_env_reward,
       coalesce(sum(e.num_agent_tokens) FILTER (WHERE e.played), 0)::BIGINT AS agent_tokens,
       round(1 - avg(t.ok) FILTER (WHERE e.played), 3) AS format_error_rate,
       count(DISTINCT (e.task_id, e.sample_index)) FILTER (WHERE NOT e.pair_played) AS errors,
       count(*) FILTER (WHERE NOT e.played AND e.pair_played) AS errors_retried,
       count(*) FILTER (WHERE e.status = 'truncated') AS truncated,
       round(epoch(max(e.finished_at) - min(e.started_at)), 1) AS seconds
FROM e LEFT JOIN (SELECT episode_id, avg(format_ok::INT) AS ok FROM turns GROUP BY episode_id) t
USING (episode_id) GROUP BY e.env ORDER BY e.env
"""


def collect_summary(lake: Lake, run_id: str) -> pl.DataFrame:
    """Run `run_id`'s episodes now, one row per env (in env order). Rates and means leave out the episodes
    that ended in an env error, which are counted on their own.

    Columns: env; episodes (played ones); success_rate, mean_turns, mean_env_reward, format_error_rate (share
    of turns whose reply failed to parse, averaged per episode), rounded; agent_tokens; errors ((task, sample)
    pairs whose every episode ended in an env error); errors_retried (errored episodes whose pair a resume has
    since played); truncated; seconds (first start to last finish)."""
    return lake.query(COLLECT_SUMMARY_SQL, [run_id])


#: the success rate of imported episodes none of which carries a success flag (AgentGym's trajectory files have
#: none): not a number, and never counted as failures
NO_OUTCOME = "n/a: imported without outcome"

IMPORTED_SUMMARY_SQL = f"""
SELECT e.env, count(*) AS episodes, round(avg(e.num_turns), 1) AS mean_turns,
       CASE WHEN count(e.success) = 0 THEN '{NO_OUTCOME}'
            WHEN count(e.success) < count(*) THEN format('{{}} ({{}} of {{}} with an outcome)',
                 round(avg(e.success::INT), 3), count(e.success), count(*))
            ELSE round(avg(e.success::INT), 3)::VARCHAR END AS success_rate
FROM episodes e JOIN runs r USING (run_id) WHERE r.kind = 'import'
GROUP BY e.env ORDER BY e.env
"""


def imported_summary(lake: Lake) -> pl.DataFrame:
    """The lake's imported episodes (runs of kind `import`), one row per env (in env order).

    Columns: env; episodes; mean_turns (rounded); success_rate, as text: the rate over the episodes that carry
    a success flag (rounded; `(K of N with an outcome)` when only K of them do), NO_OUTCOME when none does."""
    return lake.query(IMPORTED_SUMMARY_SQL)


# ---- evaluations -------------------------------------------------------------------------------------------

CONTAMINATION_SQL = ("SELECT * FROM eval_contamination WHERE eval_run IN (SELECT unnest(?::VARCHAR[])) "
                     "ORDER BY eval_run, env, split, policy_id")


def eval_contamination(lake: Lake, eval_runs: Iterable[str], *, snapshot: int | None = None) -> pl.DataFrame:
    """Whether the numbers of eval runs `eval_runs` are held out: the store's `eval_contamination` view
    (schemas/lineage_views.py), one row per eval run, env, split and policy, in that order.

    Columns: eval_run, policy_id, env, split (str); tasks, contaminated_tasks (tasks sharing a task id or a
    goal with an episode the policy's lineage trained on), episodes, successes, clean_tasks, clean_episodes,
    clean_successes (int); success_rate, clean_success_rate (float, rounded to 3 places; null over none)."""
    return lake.query(CONTAMINATION_SQL, [list(eval_runs)], snapshot=snapshot)


# ---- policies and specs ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class PolicySource:
    """Where a stored policy's weights are: its checkpoint (None for a base model's own policy) and the base
    model it was trained from."""

    checkpoint_uri: str | None
    base_model: str | None


def policy_source(lake: Lake, policy_id: str | None, *, snapshot: int | None = None) -> PolicySource | None:
    """The stored policy `policy_id`'s checkpoint and base model (None: the lake has no such policy)."""
    rows = lake.query("SELECT checkpoint_uri, base_model FROM policies WHERE policy_id = ?", [policy_id],
                      snapshot=snapshot)
    return PolicySource(*rows.row(0)) if rows.height else None


def reward_spec_names(lake: Lake, *, snapshot: int | None = None) -> list[tuple[str, str]]:
    """(spec_id, name) of every stored reward spec, oldest first."""
    return lake.query("SELECT spec_id, name FROM reward_specs ORDER BY created_at, spec_id", snapshot=snapshot).rows()


def latest_spec(lake: Lake, *, snapshot: int | None = None) -> str | None:
    """The id of the reward spec stored last (None: nothing scored)."""
    rows = lake.query("SELECT spec_id FROM reward_specs ORDER BY created_at DESC, spec_id LIMIT 1", snapshot=snapshot)
    return rows.item() if rows.height else None


__all__ = ["NO_OUTCOME", "EpisodeFilterError", "PolicySource", "RunErrors", "check_episode_filter", "collect_summary",
           "count_episodes", "episode_rewards", "imported_summary",
           "eval_contamination", "latest_spec", "policy_source", "reward_spec_names", "run_errors",
           "stored_episode_ids", "training_turns"]
