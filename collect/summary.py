"""The table printed after a collect run; every number is read back from the store."""

from __future__ import annotations

from trajlake.display import emit_vertical

SUMMARY_SQL = """
SELECT e.env, count(*) AS episodes, round(avg(e.success::INT), 3) AS success_rate,
       round(avg(e.num_turns), 2) AS mean_turns, round(avg(e.env_reward), 3) AS mean_env_reward,
       sum(e.num_agent_tokens)::BIGINT AS agent_tokens,
       round(1 - avg(t.ok), 3) AS format_error_rate,
       count(*) FILTER (WHERE e.status = 'error') AS errors,
       count(*) FILTER (WHERE e.status = 'truncated') AS truncated,
       round(epoch(max(e.finished_at) - min(e.started_at)), 1) AS seconds
FROM episodes e LEFT JOIN (SELECT episode_id, avg(format_ok::INT) AS ok FROM turns GROUP BY episode_id) t
USING (episode_id) WHERE e.run_id = ? GROUP BY e.env
"""


def run_summary(lake, run_id: str):
    return lake.query(SUMMARY_SQL, [run_id])


def print_summary(lake, run_id: str) -> None:
    """One column per env, one row per metric (the metrics do not fit a terminal side by side)."""
    emit_vertical(run_summary(lake, run_id), key="env")
