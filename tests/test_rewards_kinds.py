"""The component kinds as modules: every module of rewards/kinds/ is registered by importing the registry alone,
the test oracle (tests/reward_reference.py) answers for every kind, and the spec checks' one scratch DuckDB
serves many threads at once."""

from __future__ import annotations

import importlib
import math
import pkgutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import duckdb
import pytest

from tests import reward_reference as reference
from trajlake.core.errors import TrajlakeError
from trajlake.rewards import kinds as kinds_package
from trajlake.rewards.component_kind import ComponentKind
from trajlake.rewards.components import BUILTIN_KINDS, get_kind, validate_component
from trajlake.rewards.expr_checks import SCRATCH_DB, ScratchSchemaDB, check_regex

#: the fewest parameters each built-in kind accepts (a new kind needs an entry here and a reference branch)
MINIMAL_PARAMS = {
    "goal": {},
    "length_penalty": {"max": 3},
    "format": {},
    "env_reward": {},
    "process": {"signal": "positive_step"},
    "sql": {"expr": "num_turns * 0.5"},
    "python": {"function": "math:fsum"},
}


def _module_kinds() -> list[ComponentKind]:
    """The ComponentKind each module of rewards/kinds/ defines."""
    found = []
    for info in pkgutil.iter_modules(kinds_package.__path__):
        module = importlib.import_module(f"{kinds_package.__name__}.{info.name}")
        found += [v for v in vars(module).values() if isinstance(v, ComponentKind)]
    return found


def test_every_kind_module_is_a_registered_builtin():
    in_modules = _module_kinds()
    assert sorted(k.kind for k in in_modules) == sorted(MINIMAL_PARAMS)
    assert {id(k) for k in in_modules} == {id(k) for k in BUILTIN_KINDS}
    for kind in in_modules:
        assert get_kind(kind.kind) is kind


def test_importing_the_registry_alone_yields_every_kind():
    """No kind waits on a side-effect import: a fresh interpreter that imports only the registry has all of them."""
    out = subprocess.run([sys.executable, "-c", "from trajlake.rewards.components import kinds; print(kinds())"],
                         capture_output=True, text=True, check=True).stdout
    assert out.strip() == repr(sorted(MINIMAL_PARAMS))


def test_reference_answers_for_every_kind():
    """The oracle is written apart from the kinds; a kind it does not know would leave the query unchecked."""
    ep = {"success": None, "status": "truncated", "env_reward": 0.25, "env": "maze", "num_turns": 2}
    turns = [{"turn": 0, "step_reward": 1.0, "format_ok": True, "action_text": "go", "response_token_ids": [1, 2],
              "info": '{"score": 0.5}', "observation": "a", "done": False},
             {"turn": 1, "step_reward": -1.0, "format_ok": False, "action_text": "stop now",
              "response_token_ids": [3, 4, 5, 6], "info": '{"score": 0.75}', "observation": "b", "done": True}]
    from_python = {"sql": lambda e, ts: e["num_turns"] * 0.5, "python": lambda e, ts: math.fsum([0.5])}
    want = {"goal": 0.75, "length_penalty": -0.01, "format": 0.5, "env_reward": 0.0, "process": 1.0, "sql": 1.0,
            "python": 0.5}
    for kind in BUILTIN_KINDS:
        params = validate_component(kind.kind, MINIMAL_PARAMS[kind.kind])
        got = reference.component_value(kind.kind, params, ep, turns, from_python.get(kind.kind))
        assert got == pytest.approx(want[kind.kind]), kind.kind


def _bind(i: int) -> str:
    """Bind one expression and one regex on the shared scratch DuckDB: even i valid, odd i naming a missing
    column; the answer is what a check would report."""
    column = "num_turns" if i % 2 == 0 else f"no_column_{i}"
    try:
        SCRATCH_DB.execute(f"SELECT CAST(({column} * {i}) AS DOUBLE) FROM episodes LIMIT 0")
        check_regex(f"^x{{{i % 5 + 1}}}")
        return "ok"
    except (duckdb.Error, TrajlakeError) as e:
        return str(e).splitlines()[0]


def test_scratch_db_serves_many_threads_as_one():
    """The checks' one connection, shared by eight threads, answers each check as it does on one thread."""
    alone = [_bind(i) for i in range(200)]
    with ThreadPoolExecutor(max_workers=8) as pool:
        together = list(pool.map(_bind, range(200)))
    assert together == alone
    assert alone[::2] == ["ok"] * 100
    assert all(f'"no_column_{i}" not found' in alone[i] for i in range(1, 200, 2))


def test_scratch_db_binds_against_the_store_schemas():
    scratch = ScratchSchemaDB()
    scratch.execute("SELECT num_turns, env_reward FROM episodes LIMIT 0")
    scratch.execute("SELECT regexp_matches(observation, ?) FROM turns LIMIT 0", ["^a"])
    with pytest.raises(duckdb.Error, match="no_such_table"):
        scratch.execute("SELECT 1 FROM no_such_table")
