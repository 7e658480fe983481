-- Reward spec differences: each episode's total under two reward specs side by side, biggest changes first.
-- Placeholders: set name_a / name_b in `params` to two spec names (see: SELECT name, spec_id, created_at
-- FROM reward_specs); a name picks its most recent spec. NULL (as shipped) compares the two most recently
-- created specs: A = the older, B = the newer.
WITH params AS (
    SELECT NULL::VARCHAR AS name_a, NULL::VARCHAR AS name_b
),
ranked AS (
    SELECT spec_id, name, row_number() OVER (ORDER BY created_at DESC, spec_id) AS recency,
           row_number() OVER (PARTITION BY name ORDER BY created_at DESC, spec_id) AS name_recency
    FROM reward_specs
),
pick AS (
    SELECT coalesce((SELECT spec_id FROM ranked, params WHERE name = name_a AND name_recency = 1),
                    (SELECT spec_id FROM ranked, params WHERE name_a IS NULL AND recency = 2)) AS a,
           coalesce((SELECT spec_id FROM ranked, params WHERE name = name_b AND name_recency = 1),
                    (SELECT spec_id FROM ranked, params WHERE name_b IS NULL AND recency = 1)) AS b
)
SELECT sa.name AS spec_a, sb.name AS spec_b, e.episode_id, e.env, e.policy_id, e.success,
       round(ra.total, 4) AS total_a, round(rb.total, 4) AS total_b, round(rb.total - ra.total, 4) AS delta
FROM pick
JOIN episode_rewards ra ON ra.spec_id = pick.a
JOIN episode_rewards rb ON rb.spec_id = pick.b AND rb.episode_id = ra.episode_id
JOIN reward_specs sa ON sa.spec_id = pick.a
JOIN reward_specs sb ON sb.spec_id = pick.b
JOIN episodes e ON e.episode_id = ra.episode_id
ORDER BY abs(rb.total - ra.total) DESC, e.episode_id
LIMIT 20
