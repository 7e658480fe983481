"""Property-based fuzzing of `trajlake import agentgym` (hypothesis): random and malformed files (JSONL, JSON,
parquet; random JSON values, rows that are almost right, deep nesting, random bytes). Whatever the file, the
import exits 0 or 1 with no traceback and no "internal error"; a refusal is one `error: ` line naming the file,
and leaves the lake's files as they were; nothing is written outside the lake.
"""

from __future__ import annotations

import json
import os

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from tests.bad_inputs_common import disk_state

#: in the slow tier (CI runs it), so that `make test` stays under 8 minutes
pytestmark = pytest.mark.slow

FUZZ = settings(max_examples=12, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

SCALARS = st.one_of(st.none(), st.booleans(), st.integers(min_value=-(2**70), max_value=2**70),
                    st.floats(allow_nan=False), st.text(max_size=20))
JSON = st.recursive(SCALARS, lambda kids: st.one_of(st.lists(kids, max_size=3),
                                                    st.dictionaries(st.text(max_size=8), kids, max_size=3)),
                    max_leaves=12)
ROLE = st.one_of(st.sampled_from(["human", "gpt", "system", "user", "assistant"]), JSON)
MESSAGE = st.one_of(
    st.fixed_dictionaries({"from": ROLE, "value": st.one_of(st.text(max_size=30), JSON)},
                          optional={"loss": st.one_of(st.booleans(), st.none(), JSON)}),
    JSON)
ROW = st.one_of(
    st.fixed_dictionaries(
        {"conversations": st.one_of(st.lists(MESSAGE, max_size=5), JSON, st.text(max_size=30))},
        optional={"item_id": st.one_of(st.text(max_size=20), JSON),
                  "data_source": st.one_of(st.text(max_size=20), JSON),
                  "reward": JSON, "success": JSON, "extra_info": JSON, "reward_model": JSON}),
    JSON)
#: rows that are right, so a fuzzed file holding them imports
GOOD = {"item_id": "t_1", "data_source": "fuzz", "conversations": [
    {"from": "human", "value": "Goal: x."}, {"from": "gpt", "value": "Action: go", "loss": True}]}


def _deep(n: int) -> str:
    return "[" * n + "]" * n


@pytest.fixture(scope="module")
def import_lake(tmp_path_factory):
    from trajlake.store import Lake

    root = tmp_path_factory.mktemp("fuzz-import")
    Lake.open(str(root / "lake")).close()  # an existing lake: a refusal must leave its files as they were
    return root


def _check(path, root, tiny, capsys) -> None:
    from trajlake.cli import main

    lake = root / "lake"
    before = disk_state(root)
    rc = main(["--lake", str(lake), "import", "agentgym", str(path), "--tokenizer", str(tiny)])
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err + captured.out, captured.err
    lines = [line for line in captured.err.splitlines() if line.strip().startswith("error")]
    assert rc in (0, 1), captured.err
    after = disk_state(root)
    if rc == 1:
        assert len(lines) == 1 and lines[0].startswith("error: ") and "internal error" not in lines[0], lines
        assert after == before, "a refused import changed files"
    else:
        assert not lines, lines
    changed = {p for p in set(after) ^ set(before)} | {p for p in after if p in before and after[p] != before[p]}
    outside = [p for p in changed if not (p.startswith("lake") or p == os.path.relpath(path, root))]
    assert not outside, outside


@FUZZ
@given(rows=st.lists(ROW, max_size=4), good=st.booleans())
def test_fuzzed_jsonl_rows(rows, good, import_lake, tiny, capsys, tmp_path):
    path = import_lake / "in.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in ([GOOD] if good else []) + rows) + "\n")
    _check(path, import_lake, tiny, capsys)


@FUZZ
@given(value=st.one_of(st.lists(ROW, max_size=4), JSON))
def test_fuzzed_json_files(value, import_lake, tiny, capsys, tmp_path):
    path = import_lake / "in.json"
    path.write_text(json.dumps(value))
    _check(path, import_lake, tiny, capsys)


@FUZZ
@given(data=st.binary(max_size=200), suffix=st.sampled_from([".jsonl", ".json", ".parquet"]))
def test_fuzzed_bytes(data, suffix, import_lake, tiny, capsys, tmp_path):
    path = import_lake / f"raw{suffix}"
    path.write_bytes(data)
    _check(path, import_lake, tiny, capsys)


@FUZZ
@given(rows=st.lists(ROW, min_size=1, max_size=3))
def test_fuzzed_parquet_files(rows, import_lake, tiny, capsys, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = import_lake / "in.parquet"
    try:
        table = pa.Table.from_pylist([r if isinstance(r, dict) else {"conversations": r} for r in rows])
        pq.write_table(table, path)
    except (pa.ArrowException, TypeError, ValueError, OverflowError):
        assume(False)  # rows Arrow cannot type or store: not a parquet file anyone can write
    _check(path, import_lake, tiny, capsys)


@pytest.mark.parametrize("text, name", [
    ('{"item_id": "a_1", "conversations": ' + _deep(5000) + "}\n", "deep.jsonl"),
    ("[" + json.dumps(GOOD) + ', {"x": ' + _deep(5000) + "}]", "deep.json"),
    (json.dumps({**GOOD, "conversations": '[{"from": "human", "value": "x"}, ' + _deep(3000) + "]"}) + "\n",
     "deep-text.jsonl"),
    (json.dumps({**GOOD, "reward_model": {"ground_truth": json.loads(_deep(70))}}) + "\n", "deep-truth.jsonl"),
    (json.dumps({**GOOD, "prompt": json.loads(_deep(70))}) + "\n", "deep-prompt.jsonl"),
])
def test_deep_nesting_is_one_line(text, name, import_lake, tiny, capsys):
    """JSON nested deeper than Python's recursion limit (RecursionError) or than MAX_DEPTH: one line naming
    the file and the row."""
    from trajlake.cli import main

    path = import_lake / name
    path.write_text(text)
    before = disk_state(import_lake)
    rc = main(["--lake", str(import_lake / "lake"), "import", "agentgym", str(path), "--tokenizer", str(tiny)])
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert rc == 1 and len(lines) == 1 and "Traceback" not in err, err
    assert str(path) in lines[0] and ("row" in lines[0] or "line" in lines[0]) and "nested" in lines[0], lines[0]
    assert disk_state(import_lake) == before
