-- Format errors by turn index: per env, policy and turn number, how many replies had no valid action
-- (turns.format_ok false) and the error rate. Do errors start at once, or pile up late in long episodes?
SELECT e.env, e.policy_id, t.turn,
       count(*) AS replies,
       count(*) FILTER (WHERE NOT t.format_ok) AS format_errors,
       round(avg((NOT t.format_ok)::INT), 3) AS error_rate
FROM turns t
JOIN episodes e USING (episode_id)
GROUP BY e.env, e.policy_id, t.turn
ORDER BY e.env, e.policy_id, t.turn
