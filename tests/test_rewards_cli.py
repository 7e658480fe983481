"""The `trajlake rewards` commands on real DuckLake lakes: replay at a snapshot, token_rewards through `trajlake sql`
(equal to the reference allocation), `rewards diff`, and their one-line errors."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest

from tests import reward_reference as reference
from tests.test_rewards_replay import GOAL_AND_TURNS, add, make_episode, n_snapshots, totals
from trajlake.cli import main
from trajlake.rewards import SPECS_DIR, default_spec, load_spec
from trajlake.store import Lake


def sql_json(lake_uri: str, capsys, query: str, snapshot: int | None = None) -> list[dict]:
    args = ["--lake", lake_uri, "sql", query, "-f", "json"] + (["--snapshot", str(snapshot)] if snapshot else [])
    capsys.readouterr()
    assert main(args) == 0
    return json.loads(capsys.readouterr().out)


def said(capsys) -> str:
    """What the CLI printed, with the console's line wrapping undone."""
    return " ".join(capsys.readouterr().out.split())


def test_cli_rewards_replay_and_token_rewards(tmp_path, capsys):
    uri = str(tmp_path / "lake")
    eps = {"c1": make_episode("c1", n=2), "c2": make_episode("c2", success=False, n=3),
           "c3": make_episode("c3", env="guess", n=1)}
    with Lake.open(uri) as lk:
        old = add(lk, eps["c1"], eps["c2"])
        add(lk, eps["c3"])

    # the default spec, at the old snapshot
    assert main(["--lake", uri, "rewards", "--snapshot", str(old)]) == 0
    out = said(capsys)
    assert "spec default" in out and "scored 2 episodes" in out and f"read at snapshot {old}" in out
    scored_at = int(out.split("wrote snapshot ")[1].split()[0])
    assert main(["--lake", uri, "rewards", "--snapshot", str(old)]) == 0
    assert "nothing new to store" in said(capsys)

    # a spec file with a filter, then without
    spec = load_spec(GOAL_AND_TURNS)
    assert main(["--lake", uri, "rewards", "--spec", str(GOAL_AND_TURNS), "--where", "env = 'guess'"]) == 0
    out = said(capsys)
    assert spec.spec_id in out and "scored 1 episodes" in out
    assert main(["--lake", uri, "rewards", "--spec", str(GOAL_AND_TURNS)]) == 0
    assert "scored 2 episodes" in said(capsys)
    with Lake.open(uri) as lk:
        before = n_snapshots(lk)
    assert main(["--lake", uri, "rewards", "--spec", str(GOAL_AND_TURNS)]) == 0
    assert "nothing new to store" in said(capsys)
    with Lake.open(uri) as lk:
        assert n_snapshots(lk) == before

    # token_rewards through `trajlake sql`, equal to the reference allocation
    q = ("SELECT episode_id, position, reward FROM token_rewards WHERE spec_id = '{}' "
         "ORDER BY episode_id, position")
    got = sql_json(uri, capsys, q.format(spec.spec_id))
    tot = {r["episode_id"]: r["total"] for r in sql_json(
        uri, capsys, f"SELECT episode_id, total FROM episode_rewards WHERE spec_id = '{spec.spec_id}'")}
    for eid, (_, turns) in eps.items():
        tds = [dataclasses.asdict(t) for t in turns]
        want = reference.allocate("discounted", 0.9, tot[eid], tds)
        mine = {r["position"]: r["reward"] for r in got if r["episode_id"] == eid}
        assert mine == pytest.approx(want), eid

    # --snapshot pins the view: before any scoring nothing, right after the old scoring only the default spec
    default_id = default_spec().spec_id
    assert sql_json(uri, capsys, "SELECT count(*) AS n FROM token_rewards", snapshot=old) == [{"n": 0}]
    pinned = sql_json(uri, capsys, "SELECT DISTINCT spec_id, episode_id FROM token_rewards ORDER BY 2",
                      snapshot=scored_at)
    assert pinned == [{"spec_id": default_id, "episode_id": "c1"}, {"spec_id": default_id, "episode_id": "c2"}]
    latest = sql_json(uri, capsys, "SELECT count(DISTINCT spec_id) AS s, count(DISTINCT episode_id) AS e "
                                   "FROM token_rewards")
    assert latest == [{"s": 2, "e": 3}]


def test_cli_rewards_diff(tmp_path, capsys):
    uri = str(tmp_path / "lake")
    with Lake.open(uri) as lk:
        add(lk, *(make_episode(f"e{i}", success=i % 2 == 0, good=i < 2, n=1 + i) for i in range(5)))
    a, b = SPECS_DIR / "default.toml", GOAL_AND_TURNS
    assert main(["--lake", uri, "rewards", "diff", str(a), str(b), "--top", "2"]) == 0
    out = capsys.readouterr().out
    sa, sb = load_spec(a), load_spec(b)
    assert f"A = default ({sa.spec_id}), B = goal-and-turns ({sb.spec_id})" in " ".join(out.split())
    for metric in ("episodes", "mean_a", "mean_b", "mean_a_success", "mean_b_success", "changed"):
        assert metric in out
    with Lake.open(uri) as lk:
        ta, tb = totals(lk, sa), totals(lk, sb)
    top = sorted(ta, key=lambda e: (-abs(tb[e] - ta[e]), e))
    table = out.split("delta", 1)[1]
    assert top[0] in table and top[1] in table
    assert not any(e in table for e in top[2:])
    # errors are one line and exit 1, before any work
    bad = tmp_path / "bad.toml"
    bad.write_text('name = "b"\n[[components]]\nkind = "nope"\n')
    assert main(["--lake", uri, "rewards", "diff", str(a), str(bad)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"error: {bad}:2: component 1 (nope): unknown component kind 'nope'")


def test_cli_rewards_errors(tmp_path, capsys):
    uri = str(tmp_path / "lake")
    with Lake.open(uri) as lk:
        add(lk, make_episode("e1"))
    assert main(["--lake", uri, "rewards", "--spec", str(tmp_path / "missing.toml")]) == 1
    assert "no such file" in capsys.readouterr().err
    nan = tmp_path / "nan.toml"
    nan.write_text('name = "nan"\n[[components]]\nkind = "sql"\nname = "ratio"\nexpr = "1.0 / (num_turns - 2)"\n')
    assert main(["--lake", uri, "rewards", "--spec", str(nan)]) == 1
    err = capsys.readouterr().err
    assert "episode e1" in err and "component ratio" in err and math.isinf(float(err.split(" is ")[-1].split()[0]))
