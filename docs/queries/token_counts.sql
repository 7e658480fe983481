-- Token counts per env and policy: prompt tokens (what the model read) and response tokens (what it wrote,
-- the agent tokens), in total, per episode and per turn, and the longest episode's whole sequence.
-- Each turn stores only the tokens new since the previous turn, so the sums are exact sequence lengths.
-- num_prompt_tokens / num_response_tokens are the lengths of the turn's id lists, kept by the store so
-- that counting does not decode the ids.
WITH per_episode AS (
    SELECT episode_id, count(*) AS turns,
           sum(num_prompt_tokens)::BIGINT AS prompt_tokens,
           sum(num_response_tokens)::BIGINT AS response_tokens
    FROM turns
    GROUP BY episode_id
)
SELECT e.env, e.policy_id,
       count(*) AS episodes,
       sum(p.turns)::BIGINT AS turns,
       sum(p.prompt_tokens)::BIGINT AS prompt_tokens,
       sum(p.response_tokens)::BIGINT AS response_tokens,
       round(avg(p.prompt_tokens), 1) AS prompt_per_episode,
       round(avg(p.response_tokens), 1) AS response_per_episode,
       round(sum(p.response_tokens) / sum(p.turns), 1) AS response_per_turn,
       max(p.prompt_tokens + p.response_tokens) AS longest_episode_tokens
FROM episodes e
JOIN per_episode p USING (episode_id)
GROUP BY e.env, e.policy_id
ORDER BY e.env, e.policy_id
