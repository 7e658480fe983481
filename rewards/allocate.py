"""Allocation of episode rewards to tokens, as a query over turn spans: the `token_rewards` view.

token_rewards(spec_id, episode_id, turn, position, reward): position is the index in the episode's full
token sequence (the concatenation of prompt and response ids over its turns); only non-zero entries.
The strategy and gamma come from each spec's stored content, so one view serves every spec:

- last_token: R on the last agent token.
- uniform_positive: R > 0 spread evenly over all agent tokens; R < 0 on the last agent token.
- discounted: walking agent segments from last to first, each token of a segment gets c / len(segment),
  then c *= gamma ** len(segment) (c starts at R): OpenManus-RL's discounted allocation.
- per_turn: each turn's process rewards (turn_rewards) on that turn's last agent token, and the rest of
  R (the outcome part) on the episode's last agent token.

Turns with no agent tokens carry nothing (a process reward on such a turn is dropped).
"""

from __future__ import annotations

SEGMENTS_SQL = """
WITH lens AS (  -- NULL token lists count as empty
    SELECT episode_id, turn, coalesce(len(prompt_token_ids), 0) AS np, coalesce(len(response_token_ids), 0) AS n
    FROM turns
), spans AS (
    SELECT episode_id, turn, n,
           CAST(sum(np + n) OVER (PARTITION BY episode_id ORDER BY turn ROWS UNBOUNDED PRECEDING) - n
                AS BIGINT) AS start  -- sum() is HUGEINT, which Arrow would read as decimal128
    FROM lens
), alloc AS MATERIALIZED (  -- each spec's strategy and gamma, parsed once per spec and not per segment row
    SELECT spec_id, json_extract_string(spec, '$.allocation.strategy') AS strategy,
           coalesce(TRY_CAST(json_extract(spec, '$.allocation.gamma') AS DOUBLE), 1.0) AS gamma
    FROM reward_specs
), segs AS (
    SELECT r.spec_id, s.episode_id, s.turn, s.n, s.start, r.total, sp.strategy, sp.gamma,
           sum(s.n) OVER (PARTITION BY r.spec_id, s.episode_id) AS agent_total,
           coalesce(sum(s.n) OVER (PARTITION BY r.spec_id, s.episode_id ORDER BY s.turn
                                   ROWS BETWEEN 1 FOLLOWING AND UNBOUNDED FOLLOWING), 0) AS after,
           s.turn = max(s.turn) OVER (PARTITION BY r.spec_id, s.episode_id) AS last_seg
    FROM spans s JOIN episode_rewards r USING (episode_id) JOIN alloc sp USING (spec_id)
    WHERE s.n > 0
), per_turn AS (
    SELECT g.*, coalesce(tr.reward, 0) AS process,
           sum(coalesce(tr.reward, 0)) OVER (PARTITION BY g.spec_id, g.episode_id) AS process_total
    FROM segs g LEFT JOIN turn_rewards tr USING (spec_id, episode_id, turn)
    WHERE g.strategy = 'per_turn'
)
"""

TOKEN_REWARDS_SQL = SEGMENTS_SQL + """
SELECT spec_id, episode_id, turn, start + n - 1 AS position, total AS reward
FROM segs WHERE strategy = 'last_token' AND last_seg AND total <> 0
UNION ALL
SELECT spec_id, episode_id, turn, start + i AS position, total / agent_total AS reward
FROM segs, range(n) AS r(i) WHERE strategy = 'uniform_positive' AND total > 0
UNION ALL
SELECT spec_id, episode_id, turn, start + n - 1 AS position, total AS reward
FROM segs WHERE strategy = 'uniform_positive' AND total < 0 AND last_seg
UNION ALL
SELECT spec_id, episode_id, turn, start + i AS position, total * pow(gamma, after) / n AS reward
FROM segs, range(n) AS r(i) WHERE strategy = 'discounted' AND total <> 0
UNION ALL
SELECT spec_id, episode_id, turn, start + n - 1 AS position,
       process + CASE WHEN last_seg THEN total - process_total ELSE 0 END AS reward
FROM per_turn WHERE process + CASE WHEN last_seg THEN total - process_total ELSE 0 END <> 0
"""
