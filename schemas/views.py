"""The store's views (`VIEWS`): queries over its tables that every `Lake.query` can read by name, pinned to
the snapshot the query reads. Declared here, beside the tables (schemas/tables.py), and attached by the Lake
itself to each query that names them: no import registers them.

Two views are the allocation of episode rewards to tokens, as queries over turn spans (the others, lineage and
held-out contamination, are in lineage_views.py):

token_rewards(spec_id, episode_id, turn, position, reward): position is the index in the episode's full
token sequence (the concatenation of prompt and response ids over its turns); only non-zero entries.
The strategy and gamma come from each spec's stored content, so one view serves every spec; the strategies are
those registered in schemas/allocations.py (whose SQL the view is made of when a query reads it), built in:

- last_token: R on the last agent token.
- uniform_positive: R > 0 spread evenly over all agent tokens; R < 0 on the last agent token.
- discounted: walking agent segments from last to first, each token of a segment gets c / len(segment),
  then c *= gamma ** len(segment) (c starts at R): OpenManus-RL's discounted allocation.
- per_turn: each turn's process rewards (turn_rewards) on that turn's last agent token, and the rest of
  R (the outcome part) on the episode's last agent token.

Turns with no agent tokens carry nothing (a process reward on such a turn is dropped).

reward_spans(spec_id, episode_id, turn, position, length, reward) is the same allocation run-length
encoded: one row per agent segment (or per single token) whose `length` consecutive positions from
`position` on all get `reward`. Every strategy gives each token of a span the same value, so token_rewards
is exactly the expansion of reward_spans (one row per position, the very same reward value), and a
consumer that can take spans (a trainer filling a reward tensor slice per segment, a per-episode sum)
reads one row per agent segment instead of one per agent token.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

from trajlake.schemas.allocations import ALLOCATIONS, Segment, by_strategy
from trajlake.schemas.lineage_views import EPISODE_GOALS_SQL, EVAL_CONTAMINATION_SQL, POLICY_TRAINING_EPISODES_SQL

#: the view's names for a segment's values (segs' columns)
_VIEW_SEGMENT = Segment(total="total", after="after", agent="agent_total", n="n", gamma="gamma", process="process",
                        process_total="process_total")


# One pass over the turns of the scored episodes: their token counts, then one window (every frame over the
# same partition and order, so one sort) for each agent segment's start position, the agent tokens after it,
# the episode's agent tokens and the running total of its process rewards. `after = 0` marks the last
# segment (no agent token follows it), `n > 0` the turns that have agent tokens. (Two UNION ALL branches, one
# for per_turn with the turn_rewards join and one without it, were no faster and made DuckDB 1.5.5 hang when
# the query had a prepared parameter.)
def reward_spans_sql() -> str:
    """reward_spans' query, with every strategy registered in ALLOCATIONS now (one registered after import is
    in it too)."""
    process_strategies = ", ".join(f"'{name}'" for name, entry in ALLOCATIONS.items() if entry.process) or "NULL"
    return f"""
WITH alloc AS MATERIALIZED (  -- each spec's strategy and gamma, parsed once per spec and not per segment row
    SELECT spec_id, json_extract_string(spec, '$.allocation.strategy') AS strategy,
           coalesce(TRY_CAST(json_extract(spec, '$.allocation.gamma') AS DOUBLE), 1.0) AS gamma
    FROM reward_specs
), lens AS (  -- the token counts the store keeps per turn (INTEGER, 0 for a NULL list), not the id lists
    SELECT r.spec_id, r.episode_id, t.turn, r.total, a.strategy, a.gamma,
           -- INTEGER: window sums of BIGINT run on HUGEINT, several times slower
           t.num_prompt_tokens AS np, t.num_response_tokens AS n
    FROM episode_rewards r JOIN alloc a USING (spec_id) JOIN turns t USING (episode_id)
), proc AS (  -- per_turn only: each turn's process reward
    SELECT l.*, CASE WHEN l.strategy IN ({process_strategies}) THEN coalesce(tr.reward, 0) ELSE 0 END AS process
    FROM lens l LEFT JOIN turn_rewards tr
         ON tr.spec_id = l.spec_id AND tr.episode_id = l.episode_id AND tr.turn = l.turn
), segs AS (
    SELECT spec_id, episode_id, turn, total, strategy, gamma, n, process,
           -- sum() is HUGEINT, which Arrow would read as decimal128
           CAST(sum(np + n) OVER upto - n AS BIGINT) AS start,
           CAST(sum(n) OVER whole - sum(n) OVER upto AS BIGINT) AS after,
           CAST(sum(n) OVER whole AS BIGINT) AS agent_total,
           -- the process rewards on the segments up to this one, in turn order (the reference's order): on
           -- the last segment, all of them. (A double sum over a whole ordered frame is an ordered aggregate
           -- in DuckDB 1.5.5, 20-40x slower than this running sum.)
           sum(CASE WHEN n > 0 THEN process ELSE 0 END) OVER upto AS process_total
    FROM proc
    WINDOW upto AS (PARTITION BY spec_id, episode_id ORDER BY turn ROWS UNBOUNDED PRECEDING),
           whole AS (PARTITION BY spec_id, episode_id ORDER BY turn
                     ROWS BETWEEN UNBOUNDED PRECEDING AND UNBOUNDED FOLLOWING)
), valued AS (
    SELECT spec_id, episode_id, turn, start, n,
           -- each registered strategy's expressions (schemas/allocations.py), by the spec's strategy
           {by_strategy("strategy", _VIEW_SEGMENT, "every_token")} AS every_token,
           {by_strategy("strategy", _VIEW_SEGMENT, "reward")} AS reward
    FROM segs WHERE n > 0
)
SELECT spec_id, episode_id, turn,
       CASE WHEN every_token THEN start ELSE start + n - 1 END AS position,
       CASE WHEN every_token THEN n ELSE 1 END AS length,
       reward
FROM valued WHERE reward <> 0
"""

# Single-token spans (last_token, per_turn, a negative uniform_positive) need no expansion. The two branches
# also make DuckDB estimate the expansion's size sensibly: with only the lateral range() it took the 35M token
# rows for a few hundred and, under a trainer's `episode_id IN (SELECT ...)`, built its hash table on them
# (8 CPU-s at 1M turns, against 1-2 CPU-s when the small side is built).
def token_rewards_sql() -> str:
    """token_rewards' query: reward_spans' rows, a span of several tokens expanded to one row a token."""
    return f"""
WITH spans AS ({reward_spans_sql()})
SELECT spec_id, episode_id, turn, position, reward FROM spans WHERE length = 1
UNION ALL
SELECT spec_id, episode_id, turn, position + i AS position, reward FROM spans, range(length) AS r(i) WHERE length > 1
"""


class _Views(Mapping[str, str]):
    """name -> a view's SELECT: fixed text, or made by a function when read (the allocation views, so that they
    read the strategies registered at the time)."""

    def __init__(self, entries: dict[str, str | Callable[[], str]]):
        self._entries = entries

    def __getitem__(self, name: str) -> str:
        entry = self._entries[name]
        return entry() if callable(entry) else entry

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __reversed__(self) -> Iterator[str]:
        return reversed(list(self._entries))


#: name -> SELECT over the store's bare table names and the views before it; each is a temporary view of the
#: `Lake.query` calls that name it (or name a view that reads it): lineage_views.py says what the last three hold
VIEWS: Mapping[str, str] = _Views({
    "reward_spans": reward_spans_sql, "token_rewards": token_rewards_sql,
    "policy_training_episodes": POLICY_TRAINING_EPISODES_SQL, "episode_goals": EPISODE_GOALS_SQL,
    "eval_contamination": EVAL_CONTAMINATION_SQL,
})
