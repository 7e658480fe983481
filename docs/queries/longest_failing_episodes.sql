-- The longest failing episodes: unsuccessful episodes with the most turns (then agent tokens), with their
-- policy, run, status and last reply: where to start reading transcripts. Read one with
--   trajlake sql "SELECT turn, observation, action_text, format_ok FROM turns WHERE episode_id = 'ID' ORDER BY turn"
SELECT e.episode_id, e.env, e.task_id, e.policy_id, e.run_id, e.status,
       e.num_turns, e.num_agent_tokens, e.env_reward,
       left(regexp_replace(last.action_text, '\s+', ' ', 'g'), 80) AS last_reply,
       e.error
FROM episodes e
LEFT JOIN turns last ON last.episode_id = e.episode_id AND last.turn = e.num_turns - 1
WHERE NOT coalesce(e.success, false)
ORDER BY e.num_turns DESC, e.num_agent_tokens DESC, e.episode_id
LIMIT 20
