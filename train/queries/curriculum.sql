-- task_selector = "curriculum": a difficulty curriculum over the lake's own history (TextCraft: crafting depth).
-- Copy this file, edit it (the 0.8 bar, the tiers), and give its path as task_selector to make your own.
--
-- It reads what every selector reads (train/queries/learnable.sql says what):
--   candidates(task_id, position, difficulty), params(run_id, iteration, tasks, samples, start_policy),
--   and the lake's tables and views, read-only. It returns task_id in priority order.
--
-- The current level is the lowest difficulty this run's policies (its rollouts, and its starting policy's
-- episodes) have not mastered: never played there, or won less than 80% of the time on its tasks. Its tasks
-- come first, then the harder levels in order, and the mastered levels last. Within a level, tasks are ordered
-- as `learnable` orders them: won and lost first, then never played, always won, never won, the least played
-- first, shuffled per iteration. Tasks without a difficulty come last; where the env gives none at all, every
-- task is one level and this is `learnable`.
WITH history AS (
    SELECT e.task_id, count(*) AS played, avg(e.success::INT) AS success
    FROM episodes e, params p
    WHERE (starts_with(e.run_id, p.run_id || '/it-') OR e.policy_id = p.start_policy)
      AND e.status IS DISTINCT FROM 'error'
    GROUP BY e.task_id
),
levels AS (
    SELECT c.difficulty, count(h.task_id) AS played_tasks, avg(h.success) AS success
    FROM candidates c LEFT JOIN history h ON h.task_id = c.task_id
    GROUP BY c.difficulty
),
current_level AS (
    SELECT min(difficulty) AS level FROM levels WHERE played_tasks = 0 OR success < 0.8
)
SELECT c.task_id
FROM candidates c CROSS JOIN params p CROSS JOIN current_level l LEFT JOIN history h ON h.task_id = c.task_id
ORDER BY
    CASE WHEN c.difficulty IS NOT DISTINCT FROM l.level THEN 0
         WHEN l.level IS NULL OR c.difficulty > l.level THEN 1
         ELSE 2 END,
    c.difficulty,
    CASE WHEN h.success > 0 AND h.success < 1 THEN 0
         WHEN h.played IS NULL THEN 1
         WHEN h.success = 1 THEN 2
         ELSE 3 END,
    coalesce(h.played, 0),
    hash(c.task_id || '/' || p.iteration::VARCHAR)
