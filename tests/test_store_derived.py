"""Columns the store derives at write time (turns.num_prompt_tokens / num_response_tokens, the lengths of the
id lists), on every catalog backend: computed on append, refused when a writer's value disagrees, filled in
for the rows of a lake written before they existed, and computed on the fly for snapshots from before."""

from __future__ import annotations

import pytest

from trajlake.core.errors import SchemaError, TrajlakeError
from trajlake.schemas import Episode, Turn
from trajlake.store import Lake

COUNTS = "SELECT episode_id, turn, num_prompt_tokens, num_response_tokens FROM turns ORDER BY episode_id, turn"


def turns(episode: str) -> list[Turn]:
    return [Turn(episode, 0, prompt_token_ids=(1, 2, 3), response_token_ids=(4, 5)),
            Turn(episode, 1, prompt_token_ids=(), response_token_ids=(6,)),
            Turn(episode, 2, prompt_token_ids=None, response_token_ids=None)]


def expected(*episodes: str) -> list[tuple]:
    return [(e, t, p, r) for e in episodes for t, p, r in ((0, 3, 2), (1, 0, 1), (2, 0, 0))]


def test_counts_are_computed_on_append(lake):
    lake.append({"episodes": [Episode("a")], "turns": turns("a")}, stage="collect")
    assert lake.query(COUNTS).rows() == expected("a")
    # a writer may give them (a copy of another lake's rows) when they agree
    agreeing = [Turn("b", 0, prompt_token_ids=(1,), response_token_ids=(2, 3), num_prompt_tokens=1,
                     num_response_tokens=2)]
    lake.append({"turns": agreeing}, stage="import")
    assert lake.query(COUNTS).rows()[-1] == ("b", 0, 1, 2)


def test_a_count_that_disagrees_with_its_list_is_refused_and_nothing_is_written(lake):
    lake.append({"turns": turns("a")}, stage="collect")
    before = lake.current_snapshot()
    bad = [Turn("c", 0, response_token_ids=(1, 2)), Turn("c", 1, response_token_ids=(1,), num_response_tokens=5)]
    with pytest.raises(SchemaError, match=r"turns\.num_response_tokens: row 1 says 5 but response_token_ids holds 1"):
        lake.append({"turns": bad}, stage="collect")
    assert lake.current_snapshot() == before
    assert lake.query(COUNTS).rows() == expected("a")


def _make_old(lake: Lake) -> int:
    """Turn `lake` into one written before the derived columns existed (drop them, then write a row the old
    way); returns the snapshot of that old state."""
    cur = lake._cursor()
    try:
        cur.execute("ALTER TABLE lake.turns DROP COLUMN num_prompt_tokens")
        cur.execute("ALTER TABLE lake.turns DROP COLUMN num_response_tokens")
        cur.execute("INSERT INTO lake.turns (episode_id, turn, prompt_token_ids, response_token_ids) "
                    "VALUES ('old2', 0, [7, 8], [9, 9, 9])")
    finally:
        cur.close()
    return lake.current_snapshot()


def test_opening_an_older_lake_fills_the_counts_in_and_old_snapshots_compute_them(lake_uri):
    with Lake.open(lake_uri) as lake:
        lake.append({"turns": turns("old1")}, stage="collect")
        old = _make_old(lake)
        assert "num_response_tokens" not in lake.query("SELECT * FROM turns LIMIT 0").columns
    with Lake.open(lake_uri) as lake:  # the upgrade: columns added and filled in one snapshot
        upgraded = lake.current_snapshot()
        assert upgraded == old + 1
        rows = expected("old1") + [("old2", 0, 2, 3)]
        assert lake.query(COUNTS).rows() == rows
        assert lake.query(COUNTS, snapshot=upgraded).rows() == rows
        # the snapshot before the upgrade has no such columns stored: a pinned read computes them
        assert lake.query(COUNTS, snapshot=old).rows() == rows
        assert lake.query("SELECT count(*) FROM turns", snapshot=old).item() == 4
        # new rows after the upgrade get theirs on append
        lake.append({"turns": turns("new")}, stage="collect")
        assert lake.query(COUNTS).rows() == sorted(rows + expected("new"))
    with Lake.open(lake_uri) as lake:  # opening it again changes nothing
        assert lake.current_snapshot() == upgraded + 1


def test_rewards_of_an_old_snapshot_read_the_counts_it_did_not_store(lake_uri, tmp_path):
    from trajlake.rewards import load_spec
    from trajlake.rewards.score import score

    spec_path = tmp_path / "len.toml"
    spec_path.write_text('name = "len"\n[allocation]\nstrategy = "discounted"\ngamma = 0.5\n'
                         '[[components]]\nkind = "length_penalty"\nmax = 1\nscale = 1.0\nscope = "episode"\n'
                         '[[components]]\nkind = "sql"\nexpr = "1.0"\n')
    with Lake.open(lake_uri) as lake:
        lake.append({"episodes": [Episode("old1", num_turns=3), Episode("old2", num_turns=1)],
                     "turns": turns("old1")}, stage="collect")
        old = _make_old(lake)
    with Lake.open(lake_uri) as lake:
        score(lake, load_spec(spec_path), snapshot=old)
        totals = lake.query("SELECT episode_id, total FROM episode_rewards ORDER BY episode_id").rows()
        # 3 agent tokens in each episode, 2 over the max of 1: -2, plus the sql component's 1
        assert totals == [("old1", -1.0), ("old2", -1.0)]
        spans = lake.query("SELECT episode_id, turn, position, length FROM reward_spans "
                           "ORDER BY episode_id, position", snapshot=old + 2).rows()
        assert spans == [("old1", 0, 3, 2), ("old1", 1, 5, 1), ("old2", 0, 2, 3)]


def test_updating_a_list_updates_its_count_and_the_count_cannot_be_set(lake):
    lake.append({"turns": turns("a")}, stage="collect")
    lake.update("turns", {"episode_id": "a", "turn": 1}, {"response_token_ids": [1, 2, 3, 4]}, stage="fix")
    assert lake.query(COUNTS).rows()[1] == ("a", 1, 0, 4)
    lake.update("turns", {"episode_id": "a", "turn": 0}, {"prompt_token_ids": None}, stage="fix")
    assert lake.query(COUNTS).rows()[0] == ("a", 0, 0, 2)
    before = lake.current_snapshot()
    with pytest.raises(TrajlakeError, match="num_response_tokens of turns: the store computes them from "
                                            "response_token_ids"):
        lake.update("turns", {"episode_id": "a", "turn": 2}, {"num_response_tokens": 9}, stage="fix")
    assert lake.current_snapshot() == before
