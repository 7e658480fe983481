-- Success by env and policy: episodes, success rate, mean env reward, mean turns and episodes that did not
-- end cleanly, per env, task split and policy, over every run kind (collect, import, train, eval).
-- For held-out numbers only, add: WHERE e.run_id IN (SELECT run_id FROM runs WHERE kind = 'eval')
SELECT e.env, t.split, e.policy_id,
       count(*) AS episodes,
       round(avg(e.success::INT), 3) AS success_rate,
       round(avg(e.env_reward), 3) AS mean_env_reward,
       round(avg(e.num_turns), 2) AS mean_turns,
       count(*) FILTER (WHERE e.status <> 'ok') AS not_ok
FROM episodes e
LEFT JOIN tasks t USING (task_id)
GROUP BY e.env, t.split, e.policy_id
ORDER BY e.env, t.split, success_rate DESC, e.policy_id
