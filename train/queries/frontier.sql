-- task_selector = "frontier": curriculum's levels, and within the current level every task is played before
-- any is replayed. Copy this file, edit it, and give its path as task_selector to make your own.
--
-- It reads what every selector reads (train/queries/learnable.sql says what):
--   candidates(task_id, position, difficulty), params(run_id, iteration, tasks, samples, start_policy),
--   and the lake's tables and views, read-only. It returns task_id in priority order.
--
-- The levels are curriculum's: the lowest difficulty this run's policies have not mastered (never played
-- there, or won less than 80% of the time on its tasks) first, then the harder ones, the mastered ones last.
-- Within a level, `curriculum` puts the tasks both won and lost first, so a run replays the same few tasks
-- while they stay uncertain (on TextCraft, 8 depth-1 goals in all 4 iterations: sampled success on them rose,
-- held-out success did not). Here the tasks not yet known to be always won or never won (never played, or
-- won and lost) form one tier, the least played first: every such task of the level is played once before
-- any is played again. Then tasks always won, and tasks never won last, shuffled per iteration within a tier.
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
    CASE WHEN h.played IS NULL OR (h.success > 0 AND h.success < 1) THEN 0
         WHEN h.success = 1 THEN 1
         ELSE 2 END,
    coalesce(h.played, 0),
    hash(c.task_id || '/' || p.iteration::VARCHAR)
