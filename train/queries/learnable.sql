-- task_selector = "learnable": the tasks an RL iteration plays, chosen from the lake's own history.
-- Copy this file, edit it, and give its path as task_selector to make your own curriculum.
--
-- It reads:
--   candidates(task_id, position, difficulty)  the tasks of the split it may choose from (the first task_pool)
--   params(run_id, iteration, tasks, samples, start_policy)
--                                               this train run, the iteration (from 1), how many tasks it plays
--   and any of the lake's tables and views (episodes, turns, runs, policies, ...): read-only.
-- It returns task_id in priority order; the iteration plays the first `tasks` of them (tasks it does not
-- return are never played; fewer than `tasks` is an error naming the query).
--
-- The order: tasks this run's policies (its rollouts, and its starting policy's episodes) have both won and
-- lost come first (a group there has an outcome difference to learn from), then tasks never played (to find
-- more of them), then tasks always won, and tasks never won last (nothing to reinforce yet). Within a tier,
-- the tasks played least come first, in an order shuffled per iteration (seeded by the iteration).
WITH history AS (
    SELECT e.task_id, count(*) AS played, avg(e.success::INT) AS success
    FROM episodes e, params p
    WHERE (starts_with(e.run_id, p.run_id || '/it-') OR e.policy_id = p.start_policy)
      AND e.status IS DISTINCT FROM 'error'
    GROUP BY e.task_id
)
SELECT c.task_id
FROM candidates c CROSS JOIN params p LEFT JOIN history h ON h.task_id = c.task_id
ORDER BY
    CASE WHEN h.success > 0 AND h.success < 1 THEN 0
         WHEN h.played IS NULL THEN 1
         WHEN h.success = 1 THEN 2
         ELSE 3 END,
    coalesce(h.played, 0),
    hash(c.task_id || '/' || p.iteration::VARCHAR)
