"""`score(..., spans=True)`: the allocation computed by the scoring query itself equals the `reward_spans` view's
rows for the episodes it scored, value for value, and what it stores still equals the plain-Python reference."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests import test_rewards_query as query_tests
from tests.test_rewards_query import SETTINGS, append, batch_st, check_against_reference, spec_st
from trajlake.rewards import SPECS_DIR, load_spec, parse_spec
from trajlake.rewards.score import score
from trajlake.rewards.spec import STRATEGIES, SpecError
from trajlake.schemas import Episode, Turn
from trajlake.store import Lake

COLUMNS = ("spec_id", "episode_id", "turn", "position", "length", "reward")


def rows(table) -> list[tuple]:
    return sorted(tuple(r[c] for c in COLUMNS) for r in table.to_pylist())


def view_rows(lake: Lake, spec_id: str, where: str) -> list[tuple]:
    return rows(lake.query(f"SELECT {', '.join(COLUMNS)} FROM reward_spans WHERE spec_id = ? AND "
                           f"episode_id IN (SELECT episode_id FROM episodes WHERE {where})", [spec_id], output="arrow"))


@pytest.fixture
def lake(tmp_path):
    lake = Lake.open(str(tmp_path / "lake"))
    yield lake
    lake.close()


@pytest.mark.parametrize("strategy", STRATEGIES)
@SETTINGS
@given(data=st.data())
def test_spans_equal_the_view_and_the_reference(lake, monkeypatch, strategy, data):
    text, custom = data.draw(spec_st(strategy), label="spec")
    spec = parse_spec(text)
    prefix, episodes = data.draw(batch_st(), label="episodes")
    append(lake, episodes)
    results = []

    def scoring_with_spans(lake, spec, **kw):
        results.append(score(lake, spec, spans=True, **kw))
        return results[-1]

    # the property test's own check (stored totals, components, turn rewards and the view's tokens against the
    # reference), with its scoring done by the fused query
    monkeypatch.setattr(query_tests, "score", scoring_with_spans)
    check_against_reference(lake, spec, custom, prefix, episodes)
    where = f"episode_id LIKE '{prefix}%'"
    assert rows(results[0].spans) == view_rows(lake, spec.spec_id, where)
    assert results[0].spans.schema == lake.query("SELECT * FROM reward_spans LIMIT 0", output="arrow").schema


@pytest.mark.parametrize("name", ["default", "process", "openmanus", "goal-and-turns", "textcraft-progress"])
def test_shipped_specs_spans_equal_the_view(lake, name):
    lake.append({"episodes": [Episode("e", status="ok", success=True, num_turns=3),
                              Episode("f", status="truncated", success=False, num_turns=1),
                              Episode("g", status="ok", success=False, num_turns=0)],
                 "turns": [Turn("e", 0, prompt_token_ids=[1, 2], response_token_ids=[3, 4], observation="a",
                                info={"valid": True}),
                           Turn("e", 1, prompt_token_ids=[5], response_token_ids=[6, 7, 8], observation="Got x"),
                           Turn("e", 2, prompt_token_ids=[9], response_token_ids=[], info={"score": 0.5}),
                           Turn("f", 0, prompt_token_ids=[1], response_token_ids=[2], step_reward=0.5)]},
                stage="test")
    spec = load_spec(SPECS_DIR / f"{name}.toml")
    result = score(lake, spec, spans=True)
    assert result.scored == 3
    assert rows(result.spans) == view_rows(lake, spec.spec_id, "true")
    # a re-run scores nothing and allocates nothing
    again = score(lake, spec, spans=True)
    assert again.scored == 0 and again.spans.num_rows == 0 and again.snapshot is None


def test_a_strategy_registered_once_allocates_alike_in_the_view_and_the_query(lake):
    """A new allocation strategy is one `ALLOCATIONS.add`: a spec may name it, the scoring query allocates with
    it, and the reward_spans view (made when a query reads it) holds the same rows."""
    from trajlake.schemas.allocations import ALLOCATIONS, Allocation

    text = 'name = "first"\n[allocation]\nstrategy = "test_first_segment"\n[[components]]\nkind = "goal"\n'
    ALLOCATIONS.add("test_first_segment", Allocation(  # R on every token of the first agent segment
        reward=lambda s: f"CASE WHEN {s.after} = {s.agent} - {s.n} THEN {s.total} / {s.n} ELSE 0 END",
        every_token=lambda s: "true"))
    try:
        lake.append({"episodes": [Episode("e", status="ok", success=True, num_turns=2)],
                     "turns": [Turn("e", 0, prompt_token_ids=[1, 2], response_token_ids=[3, 4]),
                               Turn("e", 1, prompt_token_ids=[5], response_token_ids=[6, 7, 8])]}, stage="test")
        spec = parse_spec(text)
        result = score(lake, spec, spans=True)
        assert rows(result.spans) == view_rows(lake, spec.spec_id, "true") == [(spec.spec_id, "e", 0, 2, 2, 0.5)]
    finally:
        ALLOCATIONS.unregister("test_first_segment")
    with pytest.raises(SpecError, match="unknown allocation strategy 'test_first_segment'"):
        parse_spec(text)
