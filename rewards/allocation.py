"""The token allocation of the episodes a query scores, computed in that same query: `score(..., spans=True)`.

The store's `reward_spans` view (schemas/views.py) allocates stored totals: it reads `episode_rewards` and reads
`turns` again, so scoring and then reading the view scans the turns twice and sorts them twice. Here the
scoring query's own turns feed one window (each agent segment's start and the agent tokens up to it, in turn
order) on their way to the per-episode aggregates, which also collect each episode's segments as a list; the
final projection turns that list into spans once the total is known. The spans are the view's rows for those
episodes, value for value: the same integer positions and the same double arithmetic on the same total
(tests/test_rewards_recompute.py holds them to it), so a trainer may take either.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from trajlake.core.sql_text import sql_str
from trajlake.rewards.spec import RewardSpec
from trajlake.schemas.allocations import ALLOCATIONS, Segment

#: the frame every segment column shares (one sort of the turns by episode and turn)
SEGMENT_WINDOW = "WINDOW upto AS (PARTITION BY episode_id ORDER BY turn ROWS UNBOUNDED PRECEDING)"

#: reward_spans' columns and types
SPANS_SCHEMA = pa.schema([("spec_id", pa.string()), ("episode_id", pa.string()), ("turn", pa.int32()),
                          ("position", pa.int64()), ("length", pa.int32()), ("reward", pa.float64())])


def segment_columns(process: bool) -> str:
    """Window columns over the scored turns: where the turn's agent tokens start in the episode's sequence, the
    agent tokens up to and including them, and (for a strategy that reads process rewards) their running total.
    The view's own expressions: its counts are INTEGER sums (a HUGEINT window sum of BIGINT is several times
    slower)."""
    cols = (", CAST(sum(num_prompt_tokens + num_response_tokens) OVER upto - num_response_tokens AS BIGINT) "
            "AS seg__start, CAST(sum(num_response_tokens) OVER upto AS BIGINT) AS seg__upto")
    if process:
        cols += (", sum(CASE WHEN num_response_tokens > 0 THEN seg__process ELSE 0 END) OVER upto "
                 "AS seg__process_total")
    return cols


def segment_aggregates(process: bool) -> dict[str, str]:
    """Per episode: its agent tokens, and its segments (turns with agent tokens) as a list, in no order."""
    fields = "'turn': turn, 'start': seg__start, 'n': num_response_tokens, 'upto': seg__upto"
    if process:
        fields += ", 'process': seg__process, 'process_total': seg__process_total"
    return {"seg__agent": "CAST(sum(num_response_tokens) AS BIGINT)",
            "seg__list": f"list({{{fields}}}) FILTER (WHERE num_response_tokens > 0)"}


def spans_sql(spec: RewardSpec) -> str:
    """The spans of an episode from its segment list and `total`: the spec's strategy's expressions (the ones
    reward_spans' CASE holds for it, schemas/allocations.py), with its every-token spans (start, n) and
    single-token ones (the segment's last token)."""
    # the gamma the view parses from the stored spec's JSON: the same double, read from the same text
    gamma = f"CAST({sql_str(repr(float(spec.allocation.gamma)))} AS DOUBLE)"
    seg = Segment(total="total", after="(seg__agent - s.upto)", agent="seg__agent", n="s.n", gamma=gamma,
                  process="s.process", process_total="s.process_total")
    strategy = ALLOCATIONS[spec.allocation.strategy]
    reward, every = strategy.reward(seg), strategy.every_token(seg)
    span = (f"{{'turn': s.turn, 'position': CASE WHEN {every} THEN s.start ELSE s.start + s.n - 1 END, "
            f"'length': CASE WHEN {every} THEN s.n ELSE 1 END, 'reward': {reward}}}")
    return f"list_filter(list_transform(seg__list, s -> {span}), s -> s.reward <> 0) AS spans"


def split_spans(result: pa.Table, spec_id: str) -> tuple[pa.Table, pa.Table]:
    """(the result without its `spans` list column, sorted by episode id as the query without spans sorts it;
    the spans as reward_spans' rows, in no order): Arrow only, batch by batch as the query returned them, no copy
    of the values beyond the episode id each span takes from its row."""
    batches = []
    for batch in result.to_batches():
        lists = batch.column("spans")
        flat = lists.flatten()
        batches.append(pa.record_batch([
            pa.repeat(pa.scalar(spec_id, pa.string()), len(flat)),
            batch.column("episode_id").take(pc.list_parent_indices(lists)),
            *(flat.field(name) for name in ("turn", "position", "length", "reward")),
        ], names=SPANS_SCHEMA.names))
    spans = pa.Table.from_batches(batches).cast(SPANS_SCHEMA) if batches else SPANS_SCHEMA.empty_table()
    episodes = result.drop_columns(["spans"])
    return episodes.take(pc.sort_indices(episodes, [("episode_id", "ascending")])), spans
