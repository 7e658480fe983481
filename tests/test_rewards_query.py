"""Property tests: the compiled reward query and the token_rewards view equal the plain-Python reference.

Each example appends freshly generated episodes and turns (unique ids) to a real DuckLake lake, scores
them with a generated spec mixing every SQL component kind, and checks, episode by episode, the stored
total and components against `reference.episode_reward` and the `token_rewards` rows against
`reference.allocate`.
"""

from __future__ import annotations

import itertools
import json
import math
from collections import defaultdict

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests import reward_reference as reference
from trajlake.rewards import SPECS_DIR, load_spec, parse_spec
from trajlake.rewards.score import score
from trajlake.rewards.spec import STRATEGIES
from trajlake.schemas import Episode, Turn
from trajlake.store import Lake

TOL = 1e-9
# modest example counts (each example appends and scores in a real lake); the lake fixture is shared by a
# test's examples on purpose (every example uses its own episode ids)
SETTINGS = settings(max_examples=10, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                           HealthCheck.data_too_large])
FEWER = settings(SETTINGS, max_examples=6)
_ids = itertools.count()

# ---- SQL expressions with their Python meaning (the reference cannot run SQL) ----------------------------
EPISODE_EXPRS = [
    ("num_turns * 0.1", lambda ep, turns: ep["num_turns"] * 0.1),
    ("coalesce(env_reward, 0) * 2 - 0.5", lambda ep, turns: (ep["env_reward"] or 0.0) * 2 - 0.5),
    ("CASE WHEN success THEN 1.0 WHEN success IS NULL THEN 0.25 ELSE -0.5 END",
     lambda ep, turns: 1.0 if ep["success"] else 0.25 if ep["success"] is None else -0.5),
    ("length(coalesce(status, '')) + num_turns", lambda ep, turns: len(ep["status"] or "") + ep["num_turns"]),
]
TURN_EXPRS = [
    ("coalesce(step_reward, 0) * 0.5", lambda t: (t["step_reward"] or 0.0) * 0.5),
    ("CASE WHEN format_ok THEN 1 ELSE -1 END", lambda t: 1.0 if t["format_ok"] else -1.0),
    ("len(coalesce(response_token_ids, [])) * 0.01", lambda t: len(t["response_token_ids"] or []) * 0.01),
    ("length(coalesce(action_text, '')) / 10 - turn", lambda t: len(t["action_text"] or "") / 10 - t["turn"]),
]
PATTERNS = ["<action>.*</action>", "^<action>", "go", "(?i)GO", r"\d+$"]

# ---- episodes and turns ---------------------------------------------------------------------------------
ACTIONS = st.sampled_from([
    "<action>go north</action>", "<think>hmm</think>\n<action>take 3</action>", "<action>a\nb</action>",
    "<action></action>", "go", "GO 12", "plain text", "", None, "<action>look", "x <action>y</action> z 7",
])
# token id lists of any length, empty ones often, and now and then none at all (NULL: read as empty)
TOKENS = st.one_of(st.lists(st.integers(0, 50_000), min_size=0, max_size=7), st.just([]), st.none())
RESPONSE = st.one_of(st.just([]), st.lists(st.integers(0, 50_000), min_size=1, max_size=9), st.none())
INFO = st.sampled_from([None, {}, {"score": 0.5}, {"score": -2}, {"score": 1.25, "valid": True}, {"valid": True},
                        {"valid": False}, {"score": None, "valid": True}, {"score": "bad"}, {"valid": "yes"},
                        [1, 2], {"other": 3}, {"valid": None}, {"success": True, "score": 0.3}, {"fail": True},
                        {"success": False, "fail": True, "score": 0.2}, {"success": "true", "score": "0.75"},
                        {"fail": 1, "score": True}, {"score": [1]}])
REWARD = st.one_of(st.none(), st.sampled_from([0.0, 1.0, -1.0]), st.floats(-5, 5, allow_nan=False))


@st.composite
def turn_st(draw, episode_id: str, turn: int) -> dict:
    return {
        "episode_id": episode_id,
        "turn": turn,
        "observation": draw(st.sampled_from(["room A", "room B", "", None])),
        "action_text": draw(ACTIONS),
        "format_ok": draw(st.sampled_from([True, False, None])),
        "step_reward": draw(REWARD),
        "done": draw(st.booleans()),
        "info": draw(INFO),
        "prompt_token_ids": draw(TOKENS),
        "response_token_ids": draw(RESPONSE),
    }


@st.composite
def episode_st(draw, episode_id: str) -> tuple[dict, list[dict]]:
    n = draw(st.integers(0, 5))
    turns = [draw(turn_st(episode_id, i)) for i in range(n)]
    ep = {
        "episode_id": episode_id,
        "env": draw(st.sampled_from(["guess", "webshop"])),
        "status": draw(st.sampled_from(["ok", "truncated", "error", None])),
        "success": draw(st.sampled_from([True, False, None])),
        "env_reward": draw(st.one_of(st.none(), st.floats(-3, 3, allow_nan=False))),
        "num_turns": n,
    }
    return ep, turns


@st.composite
def batch_st(draw) -> tuple[str, list[tuple[dict, list[dict]]]]:
    prefix = f"ex{next(_ids)}-"
    n = draw(st.integers(1, 6))
    return prefix, [draw(episode_st(f"{prefix}{i}")) for i in range(n)]


# ---- specs mixing every SQL component kind ---------------------------------------------------------------
WEIGHT = st.one_of(st.sampled_from([1.0, 0.5, -0.25, 0.0]), st.floats(-3, 3, allow_nan=False))


def toml_value(v) -> str:
    return json.dumps(v) if not isinstance(v, float) else repr(v)


@st.composite
def spec_st(draw, strategy: str) -> tuple[str, dict]:
    """TOML text of a spec with goal, length_penalty, format, env_reward, two process and an sql component,
    plus the Python meaning of its SQL expressions (component name -> callable)."""
    comps, custom = [], {}

    def comp(kind, name, **params):
        comps.append({"kind": kind, "name": name, "weight": draw(WEIGHT), **params})

    mode = draw(st.sampled_from(["episode", "openmanus"]))
    comp("goal", "goal", success=draw(st.sampled_from([1.0, 2.5])), failure=draw(st.sampled_from([-1.0, 0.0])),
         mode=mode, truncated=draw(st.sampled_from(["score", "failure"])) if mode == "episode" else "score")
    lp = {"unit": draw(st.sampled_from(["tokens", "chars"])), "scope": draw(st.sampled_from(["last", "episode"])),
          "shape": draw(st.sampled_from(["linear", "quadratic", "log"])), "scale": draw(st.floats(0, 0.5))}
    bounds = draw(st.sampled_from(["max", "min", "both"]))
    if bounds in ("max", "both"):
        lp["max"] = draw(st.integers(0, 8))
    if bounds in ("min", "both"):
        lp["min"] = draw(st.integers(0, 8))
    comp("length_penalty", "length", **lp)
    fmt = {"over": draw(st.sampled_from(["each", "last"]))}
    pattern = draw(st.sampled_from(PATTERNS + [None]))  # None: the template's format_ok flag
    if pattern is not None:
        fmt.update(pattern=pattern, dotall=draw(st.booleans()))
    if draw(st.booleans()):
        fmt["envs"] = draw(st.sampled_from([["guess"], ["webshop", "maze"]]))
    comp("format", "fmt", **fmt)
    env = {"discount": draw(st.sampled_from([1.0, 0.9, 0.5]))}
    if draw(st.booleans()):
        env["clip_min"] = draw(st.sampled_from([-1.0, 0.0]))
    if draw(st.booleans()):
        env["clip_max"] = draw(st.sampled_from([0.5, 2.0]))
    comp("env_reward", "env", **env)
    signal = draw(st.sampled_from(["format_ok", "valid_action", "new_observation", "positive_step",
                                   "result_matches"]))
    result = {"pattern": draw(st.sampled_from(["^Got ", "o", "[0-9]$"]))} if signal == "result_matches" else {}
    comp("process", "signal", signal=signal, **result,
         reward=draw(st.sampled_from([1.0, 0.05])), penalty=draw(st.sampled_from([0.0, -0.05])),
         unknown=draw(st.sampled_from(["skip", "false"])))
    texpr, tfn = draw(st.sampled_from(TURN_EXPRS))
    comp("process", "pexpr", expr=texpr)
    custom["pexpr"] = tfn
    eexpr, efn = draw(st.sampled_from(EPISODE_EXPRS))
    comp("sql", "expr", expr=eexpr)
    custom["expr"] = efn
    draw(st.randoms()).shuffle(comps)
    gamma = draw(st.sampled_from([1.0, 0.9, 0.5])) if strategy == "discounted" else 1.0
    lines = [f'name = "prop-{strategy}"', "[allocation]", f'strategy = "{strategy}"', f"gamma = {gamma!r}"]
    for c in comps:
        lines.append("[[components]]")
        lines += [f"{k} = {toml_value(v)}" for k, v in c.items()]
    return "\n".join(lines) + "\n", custom


# ---- the check ------------------------------------------------------------------------------------------
@pytest.fixture
def shared_lake(tmp_path):
    """One lake per test, shared by its hypothesis examples (each appends episodes with its own ids)."""
    lake = Lake.open(str(tmp_path / "lake"))
    yield lake
    lake.close()


def append(lake: Lake, episodes: list[tuple[dict, list[dict]]]) -> None:
    lake.append({"episodes": [Episode(**ep) for ep, _ in episodes],
                 "turns": [Turn(**t) for _, turns in episodes for t in turns]}, stage="test")


def close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=TOL, abs_tol=TOL)


def check_against_reference(lake: Lake, spec, custom: dict, prefix: str,
                            episodes: list[tuple[dict, list[dict]]]) -> None:
    where = f"episode_id LIKE '{prefix}%'"
    result = score(lake, spec, where=where)
    assert result.scored == len(episodes)
    assert result.snapshot is not None
    stored = {r["episode_id"]: r for r in lake.query(
        "SELECT episode_id, total, components FROM episode_rewards WHERE spec_id = ? AND " + where,
        [spec.spec_id], output="arrow").to_pylist()}
    assert sorted(stored) == sorted(ep["episode_id"] for ep, _ in episodes)
    tokens = lake.query(
        "SELECT episode_id, turn, position, reward FROM token_rewards WHERE spec_id = ? AND " + where,
        [spec.spec_id], output="arrow")
    assert tokens.schema.field("position").type in ("int64", "int32"), tokens.schema
    got_tokens: dict[str, dict[int, float]] = defaultdict(dict)
    for r in tokens.to_pylist():
        assert r["reward"] != 0, r  # non-zero entries only
        assert r["position"] not in got_tokens[r["episode_id"]], f"position twice: {r}"
        got_tokens[r["episode_id"]][r["position"]] = r["reward"]
    # reward_spans is the run-length form: its expansion is exactly token_rewards, value for value
    spans = lake.query(
        "SELECT episode_id, turn, position, length, reward FROM reward_spans WHERE spec_id = ? AND " + where,
        [spec.spec_id], output="arrow").to_pylist()
    assert all(r["length"] >= 1 and r["reward"] != 0 for r in spans), spans
    expanded = sorted((r["episode_id"], r["turn"], r["position"] + i, r["reward"])
                      for r in spans for i in range(r["length"]))
    assert expanded == sorted((r["episode_id"], r["turn"], r["position"], r["reward"]) for r in tokens.to_pylist())
    stored_turns = {(r["episode_id"], r["turn"]): r["reward"] for r in lake.query(
        "SELECT episode_id, turn, reward FROM turn_rewards WHERE spec_id = ? AND " + where,
        [spec.spec_id], output="arrow").to_pylist()}
    assert all(v != 0 for v in stored_turns.values())
    process = [c for c in spec.components if c.kind == "process"]
    for ep, turns in episodes:
        eid = ep["episode_id"]
        total, comps = reference.episode_reward(spec, ep, turns, custom)
        row = stored[eid]
        got_comps = dict(row["components"])
        assert set(got_comps) == set(comps)
        for name, value in comps.items():
            assert close(got_comps[name], value), (eid, name, got_comps[name], value, ep, turns)
        assert close(row["total"], total), (eid, row["total"], total)
        # the weighted process rewards of each turn, stored in turn_rewards (non-zero only)
        per_turn = [sum(c.weight * reference.process_values(c.params, turns, custom.get(c.name))[i]
                        for c in process) for i in range(len(turns))]
        for t, value in zip(turns, per_turn, strict=True):
            assert close(stored_turns.get((eid, t["turn"]), 0.0), value), (eid, t["turn"], value, stored_turns)
        want = reference.allocate(spec.allocation.strategy, spec.allocation.gamma, total, turns,
                                  per_turn if spec.allocation.strategy == "per_turn" else None)
        got = got_tokens.get(eid, {})
        # the same positions, up to entries that are zero on one side and a rounding error on the other
        for pos in set(want) | set(got):
            assert close(got.get(pos, 0.0), want.get(pos, 0.0)), (eid, pos, got, want, turns)
        assert got.keys() <= agent_positions(turns)
        if want:
            assert close(sum(got.values()), sum(want.values()))


def agent_positions(turns: list[dict]) -> set[int]:
    out, pos = set(), 0
    for t in turns:
        pos += len(t["prompt_token_ids"] or [])
        n = len(t["response_token_ids"] or [])
        out.update(range(pos, pos + n))
        pos += n
    return out


@pytest.mark.parametrize("strategy", STRATEGIES)
@SETTINGS
@given(data=st.data())
def test_query_equals_reference(shared_lake, strategy, data):
    text, custom = data.draw(spec_st(strategy), label="spec")
    spec = parse_spec(text)
    prefix, episodes = data.draw(batch_st(), label="episodes")
    append(shared_lake, episodes)
    check_against_reference(shared_lake, spec, custom, prefix, episodes)


@SETTINGS
@given(batch=batch_st())
def test_example_spec_equals_reference(shared_lake, batch):
    """The issue's example (goal + sql "num_turns * 0.1" + format, discounted 0.9) as shipped."""
    spec = load_spec(SPECS_DIR / "goal-and-turns.toml")
    prefix, episodes = batch
    append(shared_lake, episodes)
    check_against_reference(shared_lake, spec, {"sql": EPISODE_EXPRS[0][1]}, prefix, episodes)


@pytest.mark.parametrize("name", ["default", "process", "openmanus"])
@FEWER
@given(batch=batch_st())
def test_shipped_specs_equal_reference(shared_lake, name, batch):
    spec = load_spec(SPECS_DIR / f"{name}.toml")
    prefix, episodes = batch
    append(shared_lake, episodes)
    check_against_reference(shared_lake, spec, {}, prefix, episodes)


# ---- hand-checked allocations -----------------------------------------------------------------------------
def test_allocations_by_hand(tmp_path):
    """Two turns: prompt [p p] response [r r], then prompt [p] response [r r r]; one empty-response turn."""
    lake = Lake.open(str(tmp_path / "lake"))
    lake.append({"episodes": [Episode("e", status="ok", success=True, num_turns=3)],
                 "turns": [Turn("e", 0, prompt_token_ids=[1, 2], response_token_ids=[3, 4]),
                           Turn("e", 1, prompt_token_ids=[5], response_token_ids=[6, 7, 8]),
                           Turn("e", 2, prompt_token_ids=[9], response_token_ids=[])]}, stage="test")
    expected = {
        "last_token": {7: 2.0},
        "uniform_positive": {2: 0.4, 3: 0.4, 5: 0.4, 6: 0.4, 7: 0.4},
        # last segment: 2/3 each; then c = 2 * 0.5**3 = 0.25 over two tokens
        "discounted": {5: 2 / 3, 6: 2 / 3, 7: 2 / 3, 2: 0.125, 3: 0.125},
    }
    for strategy, want in expected.items():
        spec = parse_spec(f'name = "h"\n[allocation]\nstrategy = "{strategy}"\ngamma = 0.5\n'
                          '[[components]]\nkind = "goal"\nweight = 2.0\n')
        score(lake, spec)
        rows = lake.query("SELECT position, reward, turn FROM token_rewards WHERE spec_id = ? ORDER BY position",
                          [spec.spec_id]).to_dicts()
        assert {r["position"]: r["reward"] for r in rows} == pytest.approx(want), strategy
        assert all(r["turn"] == (0 if r["position"] < 4 else 1) for r in rows)
    # per_turn: no turn has info.valid, so valid_action is unknown: by default neither reward nor penalty, and
    # only the outcome is allocated
    process = ('name = "h"\n[allocation]\nstrategy = "per_turn"\n[[components]]\nkind = "goal"\n'
               '[[components]]\nkind = "process"\nsignal = "valid_action"\nreward = 1.0\npenalty = 0.5\n')
    spec = parse_spec(process)
    score(lake, spec)
    rows = lake.query("SELECT position, reward FROM token_rewards WHERE spec_id = ?", [spec.spec_id]).to_dicts()
    assert {r["position"]: r["reward"] for r in rows} == pytest.approx({7: 1.0})
    assert lake.query("SELECT count(*) AS n FROM turn_rewards WHERE spec_id = ?", [spec.spec_id])["n"][0] == 0
    # unknown = "false": process 0.5 per turn (the penalty), outcome on the end
    spec = parse_spec(process + 'unknown = "false"\n')
    score(lake, spec)
    rows = lake.query("SELECT position, reward FROM token_rewards WHERE spec_id = ?", [spec.spec_id]).to_dicts()
    # total = 1 + 1.5; turn 0 gets 0.5 on position 3; turn 1 gets 0.5 + (2.5 - 1.0) on position 7;
    # turn 2's 0.5 has no agent token to sit on and is dropped
    assert {r["position"]: r["reward"] for r in rows} == pytest.approx({3: 0.5, 7: 2.0})
    stored = lake.query("SELECT turn, reward FROM turn_rewards WHERE spec_id = ? ORDER BY turn",
                        [spec.spec_id]).to_dicts()
    assert stored == [{"turn": 0, "reward": 0.5}, {"turn": 1, "reward": 0.5}, {"turn": 2, "reward": 0.5}]
    lake.close()
