"""The shipped specs on real AgentGym expert trajectories, imported as `trajlake import agentgym` does.

A few rows of the TextCraft expert file (its ReAct replies, "Thought:\\n...\\n\\nAction:\\n...", and one
reply that gives up without an action) are imported with the tiny test tokenizer and scored with
default.toml and process.toml: the format reward follows the template flag the importer set, and turns that
carry no validity flag or step reward get neither process reward nor penalty.
"""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.conftest import SHARED
from trajlake.interop.importers import import_agentgym
from trajlake.interop.importers.agentgym_rows import parse_action
from trajlake.lm.build import build_tiny_model
from trajlake.rewards import SPECS_DIR, default_spec, load_spec, parse_spec
from trajlake.rewards.score import score
from trajlake.store import Lake

TEXTCRAFT = SHARED / "data" / "agentgym" / "textcraft" / "train.parquet"


def _rows() -> list[dict]:
    """The file's first three rows, and the first one with a reply that has no action (a format error)."""
    if not TEXTCRAFT.is_file():
        pytest.skip(f"no AgentGym TextCraft expert data at {TEXTCRAFT}")
    rows = pq.read_table(TEXTCRAFT).to_pylist()
    malformed = next(r for r in rows if any(m["from"] == "gpt" and m["loss"] and parse_action(m["value"]) is None
                                            for m in r["conversations"]))
    return rows[:3] + [malformed]


@pytest.fixture(scope="module")
def lake(tmp_path_factory):
    rows = _rows()
    tmp = tmp_path_factory.mktemp("agentgym")
    subset = tmp / "train.parquet"  # a few of the real rows, in this test's own folder
    pq.write_table(pa.Table.from_pylist(rows, schema=pq.read_schema(TEXTCRAFT)), subset)
    lk = Lake.open(str(tmp / "lake"))
    result = import_agentgym(lk, subset, str(build_tiny_model(tmp / "model")), progress=False)
    assert result.episodes == len(rows)
    yield lk
    lk.close()


def components(lake: Lake, spec) -> dict[str, dict[str, float]]:
    score(lake, spec)
    rows = lake.query("SELECT episode_id, components FROM episode_rewards WHERE spec_id = ?", [spec.spec_id],
                      output="arrow").to_pylist()
    return {r["episode_id"]: dict(r["components"]) for r in rows}


def flags(lake: Lake) -> dict[str, list[bool]]:
    out: dict[str, list[bool]] = {}
    for r in lake.query("SELECT episode_id, format_ok FROM turns ORDER BY episode_id, turn").iter_rows():
        out.setdefault(r[0], []).append(r[1])
    return out


def test_imported_turns_carry_the_template_flag_and_no_validity(lake):
    turns = lake.query("SELECT action_text, format_ok, info, step_reward FROM turns").to_dicts()
    assert all(t["format_ok"] is not None and t["step_reward"] is None for t in turns)
    assert all("valid" not in json.loads(t["info"]) for t in turns)
    assert sum(not t["format_ok"] for t in turns) >= 1  # the reply that gives up without an action
    assert all(t["format_ok"] == ("Action:" in t["action_text"]) for t in turns)


def test_default_spec_rewards_well_formed_react_replies(lake):
    got = components(lake, default_spec())
    by_episode = flags(lake)
    assert got.keys() == by_episode.keys()
    for eid, comps in got.items():
        ok = by_episode[eid]
        assert comps["format"] == pytest.approx(sum(ok) / len(ok)), eid  # the fraction the template accepted
        assert comps["format"] > 0
        assert comps["goal"] == 0.0  # the expert files give no outcome (no reward, success or score)
    # every reply of the first three rows is well formed; the fourth row's give-up reply is not
    assert sorted(c["format"] == 1.0 for c in got.values()) == [False, True, True, True]
    # the length penalty starts past 128 tokens of the last reply: expert replies are not docked for their
    # thoughts, so every one of these expert episodes (no outcome known) scores above zero
    last = dict(lake.query("SELECT episode_id, arg_max(num_response_tokens, turn) FROM turns GROUP BY 1").rows())
    for eid, comps in got.items():
        assert comps["length_penalty"] == pytest.approx(-0.01 * max(0, last[eid] - 128)), eid
    spec = default_spec()
    totals = lake.query("SELECT total FROM episode_rewards WHERE spec_id = ?", [spec.spec_id])["total"].to_list()
    assert len(totals) == len(got) and all(t > 0 for t in totals)
    # the former default, a fixed <action>.*</action> pattern, gave every one of these replies 0
    old = parse_spec('name = "old-default"\n[[components]]\nkind = "format"\npattern = "<action>.*</action>"\n')
    assert all(c["format"] == 0.0 for c in components(lake, old).values())


def test_process_spec_gives_unknown_validity_no_penalty(lake):
    spec = load_spec(SPECS_DIR / "process.toml")
    got = components(lake, spec)
    assert all(c["valid"] == 0.0 for c in got.values())  # info.valid is absent on every imported turn
    assert all(c["progress"] > 0 for c in got.values())  # observations are known: new ones still count
    per_turn = lake.query("SELECT reward FROM turn_rewards WHERE spec_id = ?", [spec.spec_id])["reward"].to_list()
    assert per_turn and all(r > 0 for r in per_turn)  # no turn is penalised
    # positive_step and format_ok signals: imported turns have no step reward (unknown), but a format flag
    signals = parse_spec('name = "signals"\n[allocation]\nstrategy = "per_turn"\n'
                         '[[components]]\nkind = "process"\nname = "step"\nsignal = "positive_step"\npenalty = -1.0\n'
                         '[[components]]\nkind = "process"\nname = "fmt"\nsignal = "format_ok"\npenalty = -1.0\n')
    got = components(lake, signals)
    by_episode = flags(lake)
    for eid, comps in got.items():
        assert comps["step"] == 0.0
        assert comps["fmt"] == pytest.approx(sum(by_episode[eid]) - sum(not f for f in by_episode[eid]))
