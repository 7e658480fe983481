"""reward_spans (the run-length allocation) by hand, on every catalog backend, and the scoring query's shape."""

from __future__ import annotations

import pytest

from trajlake.rewards import parse_spec
from trajlake.rewards.compile import compile_query, turn_rewards_query
from trajlake.rewards.score import score
from trajlake.schemas import Episode, Turn

GOAL = '[[components]]\nkind = "goal"\nweight = 2.0\n'


def spec_text(strategy: str, extra: str = "") -> str:
    return f'name = "s"\n[allocation]\nstrategy = "{strategy}"\ngamma = 0.5\n' + GOAL + extra


@pytest.fixture
def three_turns(lake):
    """prompt [p p] response [r r]; prompt [p] response [r r r]; prompt [p] and no response; success."""
    lake.append({"episodes": [Episode("e", status="ok", success=True, num_turns=3),
                              Episode("f", status="ok", success=False, num_turns=1)],
                 "turns": [Turn("e", 0, prompt_token_ids=[1, 2], response_token_ids=[3, 4]),
                           Turn("e", 1, prompt_token_ids=[5], response_token_ids=[6, 7, 8]),
                           Turn("e", 2, prompt_token_ids=[9], response_token_ids=[]),
                           Turn("f", 0, prompt_token_ids=[1], response_token_ids=[2])]}, stage="test")
    return lake


@pytest.mark.parametrize("strategy, want", [
    ("last_token", {"e": [(1, 7, 1, 2.0)], "f": [(0, 1, 1, -2.0)]}),
    # R = 2 over five agent tokens; R < 0 on the last token
    ("uniform_positive", {"e": [(0, 2, 2, 0.4), (1, 5, 3, 0.4)], "f": [(0, 1, 1, -2.0)]}),
    # the last segment 2/3 per token, then c = 2 * 0.5**3 = 0.25 over two tokens
    ("discounted", {"e": [(0, 2, 2, 0.125), (1, 5, 3, 2 / 3)], "f": [(0, 1, 1, -2.0)]}),
])
def test_spans_by_hand(three_turns, strategy, want):
    spec = parse_spec(spec_text(strategy))
    score(three_turns, spec)
    rows = three_turns.query("SELECT episode_id, turn, position, length, reward FROM reward_spans "
                             "WHERE spec_id = ? ORDER BY episode_id, position", [spec.spec_id]).to_dicts()
    got = {}
    for r in rows:
        got.setdefault(r["episode_id"], []).append((r["turn"], r["position"], r["length"], r["reward"]))
    assert got.keys() == want.keys()
    for eid, spans in want.items():
        assert [s[:3] for s in got[eid]] == [s[:3] for s in spans]
        assert [s[3] for s in got[eid]] == pytest.approx([s[3] for s in spans])


def test_per_turn_spans_and_a_prepared_filter(three_turns):
    # these turns carry no info.valid: unknown = "false" counts each as invalid (the penalty, 0.5 a turn)
    spec = parse_spec(spec_text("per_turn", '[[components]]\nkind = "process"\nsignal = "valid_action"\n'
                                            'reward = 1.0\npenalty = 0.5\nunknown = "false"\n'))
    score(three_turns, spec)
    # the trainer's shape of query: a parameter and a sub-select of episodes
    rows = three_turns.query(
        "SELECT episode_id, turn, position, length, reward FROM reward_spans WHERE spec_id = ? AND "
        "episode_id IN (SELECT episode_id FROM episodes WHERE success) ORDER BY position", [spec.spec_id]).to_dicts()
    # total 2 + 1.5: turn 0's 0.5 on its last token, turn 1's 0.5 plus the rest (3.5 - 1.0) on the last one
    assert [(r["turn"], r["position"], r["length"]) for r in rows] == [(0, 3, 1), (1, 7, 1)]
    assert [r["reward"] for r in rows] == pytest.approx([0.5, 3.0])


def test_spans_of_several_specs_at_once(three_turns):
    a, b = parse_spec(spec_text("last_token")), parse_spec(spec_text("discounted"))
    score(three_turns, a)
    score(three_turns, b)
    counts = dict(three_turns.query("SELECT spec_id, sum(length) AS n FROM reward_spans GROUP BY spec_id").rows())
    assert counts == {a.spec_id: 2, b.spec_id: 6}
    tokens = dict(three_turns.query("SELECT spec_id, count(*) AS n FROM token_rewards GROUP BY spec_id").rows())
    assert tokens == counts


def test_the_previous_observation_window_only_when_read(lake):
    lake.append({"episodes": [Episode("e", status="ok", success=True, num_turns=3)],
                 "turns": [Turn("e", i, observation=o, response_token_ids=[i]) for i, o in enumerate("aab")]},
                stage="test")
    plain = parse_spec('name = "p"\n[[components]]\nkind = "process"\nsignal = "positive_step"\n')
    assert "lag(observation)" not in compile_query(plain)
    assert "lag(observation)" not in turn_rewards_query(plain, "x")
    for process in ('signal = "new_observation"',
                    'expr = "CASE WHEN observation = PREV_OBSERVATION THEN -1 ELSE 1 END"'):
        spec = parse_spec(f'name = "q"\n[[components]]\nkind = "process"\n{process}\n')
        assert "lag(observation)" in compile_query(spec)
        score(lake, spec)
        total = lake.query("SELECT total FROM episode_rewards WHERE spec_id = ?", [spec.spec_id])["total"][0]
        # new_observation: turns 0 and 2 are new (2.0); the expr: +1 on turns 0 and 2, -1 on turn 1 (1.0)
        assert total == pytest.approx(2.0 if "signal" in process else 1.0)


def test_components_as_columns_keep_the_map(three_turns):
    spec = parse_spec(spec_text("last_token", '[[components]]\nkind = "sql"\nname = "n"\nexpr = "num_turns"\n'))
    cols = three_turns.query(compile_query(spec, components="columns"), output="arrow")
    assert cols.column_names == ["spec_id", "episode_id", "total", "c_goal", "c_n"]
    score(three_turns, spec)
    rows = three_turns.query("SELECT episode_id, components FROM episode_rewards WHERE spec_id = ? "
                             "ORDER BY episode_id", [spec.spec_id], output="arrow").to_pylist()
    assert [dict(r["components"]) for r in rows] == [{"goal": 1.0, "n": 3.0}, {"goal": -1.0, "n": 1.0}]
    assert [list(dict(r["components"])) for r in rows] == [["goal", "n"], ["goal", "n"]]
    with pytest.raises(ValueError):
        compile_query(spec, components="json")
