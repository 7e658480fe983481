"""Replay: scoring old snapshots, re-scoring old rollouts with new specs, no-op re-runs, python components,
non-finite rewards and `diff`, on real DuckLake lakes (the CLI commands: test_rewards_cli.py)."""

from __future__ import annotations

import dataclasses
import importlib
import json
import textwrap
import uuid

import pyarrow as pa
import pytest

from tests import reward_reference as reference
from trajlake.core.errors import TrajlakeError
from trajlake.rewards import SPECS_DIR, default_spec, load_spec, parse_spec
from trajlake.rewards.score import RewardValueError, diff, score
from trajlake.schemas import Episode, Turn
from trajlake.store import Lake

GOAL_AND_TURNS = SPECS_DIR / "goal-and-turns.toml"


def make_episode(eid: str, *, env: str = "maze", success: bool | None = True, status: str = "ok",
                 n: int = 2, good: bool = True) -> tuple[Episode, list[Turn]]:
    turns = [Turn(eid, i, observation=f"obs {i}", action_text="<action>go</action>" if good else "go",
                  format_ok=good, step_reward=0.5 if i == n - 1 else 0.0, info={"score": 0.25, "valid": good},
                  prompt_token_ids=list(range(10 * i, 10 * i + 3)), response_token_ids=list(range(i + 2)))
             for i in range(n)]
    return Episode(eid, env=env, status=status, success=success, num_turns=n, env_reward=0.5), turns


def add(lake: Lake, *episodes: tuple[Episode, list[Turn]]) -> int:
    r = lake.append({"episodes": [e for e, _ in episodes], "turns": [t for _, ts in episodes for t in ts]},
                    stage="collect", run_id="r1")
    return r.snapshot_id


def rows(lake: Lake, table: str, snapshot: int | None = None) -> pa.Table:
    order = {"episodes": "episode_id", "turns": "episode_id, turn"}[table]
    return lake.query(f"SELECT * FROM {table} ORDER BY {order}", snapshot=snapshot, output="arrow")


def totals(lake: Lake, spec) -> dict[str, float]:
    df = lake.query("SELECT episode_id, total FROM episode_rewards WHERE spec_id = ?", [spec.spec_id])
    return dict(zip(df["episode_id"].to_list(), df["total"].to_list(), strict=True))


def n_snapshots(lake: Lake) -> int:
    return lake.snapshots().height


@pytest.fixture
def lake(tmp_path):
    lk = Lake.open(str(tmp_path / "lake"))
    yield lk
    lk.close()


# ---- time travel and replay -------------------------------------------------------------------------
def test_score_at_an_old_snapshot_then_catch_up(lake):
    old = add(lake, make_episode("a1"), make_episode("a2", success=False))
    new = add(lake, make_episode("b1", env="guess"))
    spec = load_spec(GOAL_AND_TURNS)

    r = score(lake, spec, snapshot=old)
    assert (r.read_snapshot, r.scored) == (old, 2)
    assert r.snapshot is not None and r.snapshot > new
    assert totals(lake, spec).keys() == {"a1", "a2"}  # b1 was appended after the snapshot read
    # goal 1 / -1, sql 0.5 * num_turns * 0.1, format 0.2 * 1
    assert totals(lake, spec) == pytest.approx({"a1": 1.0 + 0.1 + 0.2, "a2": -1.0 + 0.1 + 0.2})
    stored = lake.query("SELECT name, spec FROM reward_specs WHERE spec_id = ?", [spec.spec_id]).to_dicts()
    assert stored[0]["name"] == "goal-and-turns" and json.loads(stored[0]["spec"]) == spec.to_json()

    # re-running at the same snapshot stores nothing and makes no snapshot
    before, last = n_snapshots(lake), lake.current_snapshot()
    again = score(lake, spec, snapshot=old)
    assert (again.scored, again.snapshot) == (0, None)
    assert "nothing new" in str(again)
    assert n_snapshots(lake) == before

    # the latest snapshot has one new episode: only it is scored
    latest = score(lake, spec)
    assert latest.scored == 1 and latest.snapshot == last + 1
    assert totals(lake, spec).keys() == {"a1", "a2", "b1"}
    assert lake.count("episode_rewards") == 3
    # and now every snapshot is a no-op
    for snap in (old, new, latest.snapshot, None):
        assert score(lake, spec, snapshot=snap).snapshot is None
    assert n_snapshots(lake) == before + 1


def test_a_new_spec_rescores_old_rollouts_without_touching_them(lake):
    add(lake, *(make_episode(f"e{i}", success=i % 2 == 0, good=i % 3 != 0, n=1 + i % 4) for i in range(8)))
    episodes, turns = rows(lake, "episodes"), rows(lake, "turns")
    first = default_spec()
    score(lake, first)
    snap = lake.current_snapshot()
    new = load_spec(SPECS_DIR / "process.toml")
    r = score(lake, new)
    assert r.scored == 8 and r.snapshot == snap + 1
    assert rows(lake, "episodes").equals(episodes) and rows(lake, "turns").equals(turns)
    # the new snapshot inserted into the reward tables only, and deleted nothing
    assert written_tables(lake, r.snapshot) == {"inserted": {"reward_specs", "episode_rewards", "turn_rewards"}}
    # both specs' results are kept side by side
    assert len(totals(lake, first)) == len(totals(lake, new)) == 8
    assert lake.query("SELECT count(DISTINCT spec_id) AS n FROM episode_rewards")["n"][0] == 2
    assert lake.count("turn_rewards") > 0


def written_tables(lake: Lake, snapshot: int) -> dict[str, set[str]]:
    """The tables a snapshot changed, by kind of change (DuckLake lists table ids)."""
    names = dict(lake.query("SELECT table_id, table_name FROM __ducklake_metadata_lake.ducklake_table").rows())
    changes = lake.snapshots().filter(snapshot_id=snapshot)["changes"][0]
    return {kind.removeprefix("tables_").removesuffix("_into").removesuffix("_from"):
            {names[int(t)] for t in ids} for kind, ids in changes.items()}


def test_where_filters(lake):
    add(lake, make_episode("m1", env="maze"), make_episode("m2", env="maze", success=False),
        make_episode("g1", env="guess"))
    spec = default_spec()
    r = score(lake, spec, where="env = 'maze'")
    assert r.scored == 2 and totals(lake, spec).keys() == {"m1", "m2"}
    assert score(lake, spec, where="env = 'maze'").snapshot is None
    r = score(lake, spec, where="env = 'guess' OR env = 'maze'")
    assert r.scored == 1 and totals(lake, spec).keys() == {"m1", "m2", "g1"}
    with pytest.raises(TrajlakeError, match="no_such_column"):
        score(lake, spec, where="no_such_column = 1")


def test_components_are_stored_per_episode(lake):
    add(lake, make_episode("x", n=3, good=False, success=None, status="truncated"))
    spec = load_spec(GOAL_AND_TURNS)
    score(lake, spec)
    row = lake.query("SELECT total, components FROM episode_rewards", output="arrow").to_pylist()[0]
    # truncated: goal falls back to the last turn's info.score
    assert dict(row["components"]) == pytest.approx({"goal": 0.25, "sql": 0.3, "format": 0.0})
    assert row["total"] == pytest.approx(0.25 + 0.5 * 0.3)


# ---- python components --------------------------------------------------------------------------------
def write_module(tmp_path, monkeypatch, body: str) -> str:
    name = f"reward_fns_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(body))
    monkeypatch.syspath_prepend(str(tmp_path))
    return name


def test_python_component_joins_the_query(lake, tmp_path, monkeypatch):
    module = write_module(tmp_path, monkeypatch, """
        import pyarrow as pa
        import pyarrow.compute as pc

        CALLS = []

        def tokens_and_hits(table: pa.Table):
            CALLS.append(table.num_rows)
            out = []
            for texts, tokens, env in zip(table["action_texts"].to_pylist(), table["agent_tokens"].to_pylist(),
                                          table["env"].to_pylist()):
                texts, tokens = texts or [], tokens or []
                out.append(sum(t is not None and "<action>" in t for t in texts) + 0.01 * sum(tokens)
                           + (1.0 if env == "maze" else 0.0))
            return out

        def numpy_values(table):
            import numpy as np
            return np.full(table.num_rows, 0.5)
    """)
    made = [make_episode("p1", n=3), make_episode("p2", env="guess", good=False, n=2), make_episode("p3", n=1),
            (Episode("p4", env="maze", status="error", num_turns=0), [])]
    old = add(lake, *made[:2])
    add(lake, *made[2:])
    text = f"""
        name = "with-python"
        [allocation]
        strategy = "uniform_positive"
        [[components]]
        kind = "goal"
        [[components]]
        kind = "python"
        name = "hits"
        weight = 0.5
        function = "{module}:tokens_and_hits"
        [[components]]
        kind = "python"
        name = "half"
        weight = 2.0
        function = "{module}:numpy_values"
    """
    path = tmp_path / "py.toml"
    path.write_text(textwrap.dedent(text))
    spec = load_spec(path)

    def py_value(ep: dict, turns: list[dict]) -> float:  # tokens_and_hits, one episode at a time
        hits = sum("<action>" in (t["action_text"] or "") for t in turns)
        return hits + 0.01 * sum(len(t["response_token_ids"]) for t in turns) + (ep["env"] == "maze")

    r = score(lake, spec, snapshot=old)  # time travel: the function sees only the old episodes
    assert r.scored == 2
    assert importlib.import_module(module).CALLS == [2]
    r = score(lake, spec)
    assert r.scored == 2 and importlib.import_module(module).CALLS == [2, 2]
    assert score(lake, spec).snapshot is None
    stored = {x["episode_id"]: x for x in lake.query(
        "SELECT episode_id, total, components FROM episode_rewards", output="arrow").to_pylist()}
    assert stored.keys() == {e.episode_id for e, _ in made}
    for ep, turns in made:
        eid, epd, tds = ep.episode_id, dataclasses.asdict(ep), [dataclasses.asdict(t) for t in turns]
        total, comps = reference.episode_reward(spec, epd, tds, {"hits": py_value, "half": lambda e, ts: 0.5})
        assert dict(stored[eid]["components"]) == pytest.approx(comps), eid
        assert stored[eid]["total"] == pytest.approx(total), eid
        # and the allocation follows
        got = lake.query("SELECT position, reward FROM token_rewards WHERE episode_id = ?", [eid]).to_dicts()
        want = reference.allocate("uniform_positive", 1.0, total, tds)
        assert {g["position"]: g["reward"] for g in got} == pytest.approx(want)


def test_python_component_failures(lake, tmp_path, monkeypatch):
    module = write_module(tmp_path, monkeypatch, """
        def boom(table):
            raise RuntimeError("kaput")

        def short(table):
            return [1.0]

        def nan(table):
            return [float("nan")] * table.num_rows
    """)
    add(lake, make_episode("q1"), make_episode("q2"))
    before = n_snapshots(lake)
    for fn, message in [("boom", r"python component f \(.*:boom\) failed: kaput"),
                        ("short", r"returned 1 values for 2 episodes"),
                        ("nan", r"episode q1: component f of spec py is nan")]:
        spec = parse_spec(f'name = "py"\n[[components]]\nkind = "python"\nname = "f"\nfunction = "{module}:{fn}"\n')
        with pytest.raises(TrajlakeError, match=message):
            score(lake, spec)
    assert n_snapshots(lake) == before and lake.count("episode_rewards") == 0


# ---- non-finite rewards --------------------------------------------------------------------------------
@pytest.mark.parametrize("expr, shown", [
    ("1.0/0", "inf"),
    ("'nan'::DOUBLE", "nan"),
    ("-'inf'::DOUBLE", "-inf"),
    ("exp(1000)", "inf"),
    ("CASE WHEN episode_id = 'n2' THEN 'nan'::DOUBLE ELSE 1 END", "nan"),
])
def test_non_finite_rewards_are_an_error_naming_episode_and_component(lake, expr, shown):
    add(lake, make_episode("n1"), make_episode("n2"), make_episode("n3"))
    before = n_snapshots(lake)
    spec = parse_spec(f'name = "bad"\n[[components]]\nkind = "goal"\n[[components]]\nkind = "sql"\nname = "broken"\n'
                      f'weight = 0.0\nexpr = "{expr}"\n')
    with pytest.raises(RewardValueError) as info:
        score(lake, spec)
    msg = str(info.value)
    eid = "n2" if "n2" in expr else "n1"
    assert f"episode {eid}:" in msg and "component broken" in msg and shown in msg, msg
    assert n_snapshots(lake) == before
    assert lake.count("episode_rewards") == lake.count("reward_specs") == lake.count("turn_rewards") == 0


def test_non_finite_process_rewards_and_nulls(lake):
    add(lake, make_episode("n1"), make_episode("n2"))
    spec = parse_spec('name = "bad"\n[[components]]\nkind = "process"\nname = "steps"\n'
                      'expr = "CASE WHEN turn = 1 THEN 1e308 * 10 ELSE 0 END"\n')
    with pytest.raises(RewardValueError, match=r"episode n1: component steps .* is inf"):
        score(lake, spec)
    spec = parse_spec('name = "null"\n[[components]]\nkind = "goal"\n[[components]]\nkind = "sql"\nname = "maybe"\n'
                      'expr = "CASE WHEN episode_id = \'n2\' THEN NULL ELSE 1 END"\n')
    with pytest.raises(RewardValueError, match=r"episode n2: component maybe is NULL"):
        score(lake, spec)
    assert lake.count("episode_rewards") == 0


def test_sql_runtime_errors_store_nothing(lake):
    """ln(-1) is not NaN in DuckDB but an error: the scoring query fails and nothing is stored."""
    add(lake, make_episode("n1"))
    before = n_snapshots(lake)
    spec = parse_spec('name = "ln"\n[[components]]\nkind = "sql"\nexpr = "ln(-num_turns)"\n')
    with pytest.raises(TrajlakeError, match="logarithm"):
        score(lake, spec)
    assert n_snapshots(lake) == before and lake.count("episode_rewards") == 0


# ---- diff ----------------------------------------------------------------------------------------------
def test_diff_summary_and_top_changes(lake):
    add(lake, *(make_episode(f"d{i}", success=i < 3, good=i % 2 == 0, n=1 + i) for i in range(6)))
    a = load_spec(SPECS_DIR / "default.toml")
    b = load_spec(GOAL_AND_TURNS)
    summary, changes = diff(lake, a, b, top=3)
    ta, tb = totals(lake, a), totals(lake, b)
    assert ta.keys() == tb.keys() == {f"d{i}" for i in range(6)}
    s = summary.to_dicts()[0]
    assert s["episodes"] == 6
    assert s["mean_a"] == pytest.approx(sum(ta.values()) / 6, abs=1e-4)
    assert s["mean_b"] == pytest.approx(sum(tb.values()) / 6, abs=1e-4)
    assert s["mean_delta"] == pytest.approx((sum(tb.values()) - sum(ta.values())) / 6, abs=1e-4)
    succ = [f"d{i}" for i in range(3)]
    fail = [f"d{i}" for i in range(3, 6)]
    assert s["mean_a_success"] == pytest.approx(sum(ta[e] for e in succ) / 3, abs=1e-4)
    assert s["mean_b_success"] == pytest.approx(sum(tb[e] for e in succ) / 3, abs=1e-4)
    assert s["mean_a_failure"] == pytest.approx(sum(ta[e] for e in fail) / 3, abs=1e-4)
    assert s["mean_b_failure"] == pytest.approx(sum(tb[e] for e in fail) / 3, abs=1e-4)
    assert s["changed"] == sum(abs(tb[e] - ta[e]) > 1e-12 for e in ta)
    deltas = sorted(((abs(tb[e] - ta[e]), e) for e in ta), key=lambda x: (-x[0], x[1]))
    assert changes["episode_id"].to_list() == [e for _, e in deltas[:3]]
    assert changes["delta"].to_list() == pytest.approx([tb[e] - ta[e] for _, e in deltas[:3]])
    # diffing again stores nothing new
    before = n_snapshots(lake)
    diff(lake, a, b)
    assert n_snapshots(lake) == before


def test_diff_at_a_snapshot_with_where(lake):
    old = add(lake, make_episode("o1"), make_episode("o2", env="guess", success=False))
    add(lake, make_episode("n1"))
    a, b = default_spec(), load_spec(GOAL_AND_TURNS)
    summary, changes = diff(lake, a, b, snapshot=old, where="env = 'maze'")
    assert summary["episodes"].to_list() == [1]
    assert changes["episode_id"].to_list() == ["o1"]
    assert totals(lake, a).keys() == {"o1"}
