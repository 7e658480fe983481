-- Which rollouts made each trained policy: every episode a train step on its way trained on (train_steps'
-- episode_ids), through its own run's steps up to it and, by parent_policy_id, the runs it started from
-- (e.g. the SFT warm start of a GRPO run), with the reward spec each step scored them with and who played them.
-- One row per policy, train run and spec; add e.g. WHERE t.policy_id = 'grpo-doors/step-4' to the last
-- SELECT, or select t.episode_id, to list the episodes themselves.
WITH RECURSIVE chain(policy_id, ancestor_id) AS (
    SELECT policy_id, policy_id FROM policies WHERE step IS NOT NULL
    UNION ALL
    SELECT c.policy_id, p.parent_policy_id
    FROM chain c JOIN policies p ON p.policy_id = c.ancestor_id
    WHERE p.parent_policy_id IS NOT NULL
),
reach AS (  -- the train runs on each policy's way, and the last of their steps it went through
    SELECT c.policy_id, a.run_id, max(a.step) AS upto
    FROM chain c JOIN policies a ON a.policy_id = c.ancestor_id
    WHERE a.step IS NOT NULL
    GROUP BY c.policy_id, a.run_id
),
trained AS (
    SELECT r.policy_id, s.run_id, s.step, s.spec_id, unnest(s.episode_ids) AS episode_id
    FROM reach r JOIN train_steps s ON s.run_id = r.run_id AND s.step <= r.upto
)
SELECT t.policy_id, t.run_id AS train_run, t.spec_id,
       count(DISTINCT t.step) AS step_rows,  -- train_steps rows (an SFT row: its steps since the row before)
       count(DISTINCT t.episode_id) AS episodes,
       count(*) AS episode_uses,
       string_agg(DISTINCT e.run_id, ', ' ORDER BY e.run_id) AS rollout_runs,
       string_agg(DISTINCT e.policy_id, ', ' ORDER BY e.policy_id) AS played_by,
       round(avg(e.success::INT), 3) AS success_rate
FROM trained t JOIN episodes e USING (episode_id)
GROUP BY t.policy_id, t.run_id, t.spec_id
ORDER BY t.policy_id, min(t.step), t.run_id
