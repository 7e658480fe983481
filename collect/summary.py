"""The table printed after a collect run; every number is read back from the store.

Episodes that ended in an env error (a dead env server, an env bug) say nothing about the policy: they are left
out of every rate and mean, and counted on their own: `errors` are the (task, sample) pairs whose every episode
ended in an env error (a resume with the same run id retries them), `errors_retried` the errored episodes whose
pair a resume has since played.
"""

from __future__ import annotations

from trajlake.core.display import emit_vertical

SUMMARY_SQL = """
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


def run_summary(lake, run_id: str):
    return lake.query(SUMMARY_SQL, [run_id])


def print_summary(lake, run_id: str) -> None:
    """One column per env, one row per metric (the metrics do not fit a terminal side by side)."""
    emit_vertical(run_summary(lake, run_id), key="env")


def errors_line(lake, run_id: str) -> str | None:
    """The line that ends a collect run some of whose episodes ended in env errors (None when none did)."""
    from trajlake.collect.rollout import run_errors

    errors = run_errors(lake, run_id)
    if not errors.errored:
        return None
    return (f"{errors.errored} of {errors.pairs} episodes ended with an env error (e.g. {errors.example}) and are "
            f"not counted: re-run with --run-id {run_id} to retry them")
