"""Appends that break a schema are refused before anything is written, with a message naming the problem."""

from __future__ import annotations

import polars as pl
import pyarrow as pa
import pytest

from trajlake.core.errors import SchemaError, TrajlakeError
from trajlake.schemas import TABLES, Episode, Task, Turn
from trajlake.store import Lake


def state(lake: Lake) -> tuple[int, tuple]:
    """The current snapshot and the row count of every table (one query)."""
    counts = ", ".join(f"(SELECT count(*) FROM {t})" for t in TABLES)
    return lake.current_snapshot(), lake.query(f"SELECT {counts}").rows()[0]


@pytest.fixture
def seeded(lake):
    """A lake holding a few rows, so 'unchanged' means more than 'still empty'."""
    lake.append(
        {"episodes": [Episode("e1", num_turns=1)], "turns": [Turn("e1", 0)], "tasks": [Task("t1", "maze")]},
        stage="seed",
    )
    return lake


# (name, data, error type, words the message must contain)
BAD_APPENDS = [
    ("unknown column", {"episodes": pa.table({"episode_id": ["x"], "colour": ["red"]})}, SchemaError,
     ["episodes", "colour"]),
    ("string into int column", {"episodes": pa.table({"episode_id": ["x"], "num_turns": ["3"]})}, SchemaError,
     ["episodes.num_turns", "int32"]),
    ("polars string into int column", {"episodes": pl.DataFrame({"episode_id": ["x"], "num_turns": ["3"]})},
     SchemaError, ["episodes.num_turns"]),
    ("record string into int field", {"episodes": [Episode("x", sample_index="first")]}, SchemaError,
     ["episodes", "sample_index"]),
    ("float into int column", {"episodes": pa.table({"episode_id": ["x"], "num_turns": [1.5]})}, SchemaError,
     ["episodes.num_turns"]),
    ("int into string column", {"episodes": pa.table({"episode_id": [1]})}, SchemaError, ["episodes.episode_id"]),
    ("int64 overflowing int32",
     {"episodes": pa.table({"episode_id": ["x"], "num_turns": pa.array([2**31], pa.int64())})},
     SchemaError, ["episodes.num_turns", "int32"]),
    ("token id overflowing int32",
     {"turns": pa.table({"episode_id": ["x"], "turn": [0],
                         "prompt_token_ids": pa.array([[1, 2**40]], pa.list_(pa.int64()))})},
     SchemaError, ["turns.prompt_token_ids"]),
    ("record token id overflowing int32", {"turns": [Turn("x", 0, response_token_ids=(1, -(2**31) - 1))]},
     SchemaError, ["turns", "response_token_ids"]),
    ("float token ids", {"turns": pa.table({"episode_id": ["x"], "turn": [0], "prompt_token_ids": [[1.0]]})},
     SchemaError, ["turns.prompt_token_ids"]),
    ("timestamp losing precision",
     {"runs": pa.table({"run_id": ["r"], "kind": ["k"], "started_at": pa.array([1], pa.timestamp("ns", tz="UTC"))})},
     SchemaError, ["runs.started_at"]),
    ("map of strings", {"episode_rewards": pa.table({
        "spec_id": ["s"], "episode_id": ["x"],
        "components": pa.array([[("a", "high")]], pa.map_(pa.string(), pa.string()))})},
     SchemaError, ["episode_rewards.components"]),
    ("missing required column", {"turns": pa.table({"episode_id": ["x"], "done": [True]})}, SchemaError,
     ["turns", "turn", "missing"]),
    ("null key", {"episodes": pa.table({"episode_id": pa.array([None, "y"], pa.string())})}, SchemaError,
     ["episodes.episode_id", "null"]),
    ("null key in a record", {"tasks": [Task(None, "maze")]}, SchemaError, ["tasks.task_id"]),
    ("null in a required non-key column", {"tasks": [Task("t9", None)]}, SchemaError, ["tasks.env"]),
    ("key repeated in one batch", {"episodes": [Episode("x"), Episode("y"), Episode("x", status="other")]},
     SchemaError, ["episodes", "'x'", "2 times"]),
    ("composite key repeated in one batch", {"turns": [Turn("x", 0), Turn("x", 1), Turn("x", 0)]}, SchemaError,
     ["turns", "episode_id", "turn"]),
    ("invalid JSON text", {"tasks": pa.table({"task_id": ["t9", "t10"], "env": ["maze", "maze"],
                                              "meta": ['{"ok": 1}', '{"a": 1']})},
     SchemaError, ["tasks.meta", "row 1", "JSON"]),
    ("invalid JSON text in a record table", {"train_steps": pa.table({"run_id": ["r"], "step": [1],
                                                                      "metrics": ["loss=0.5"]})},
     SchemaError, ["train_steps.metrics", "JSON"]),
    ("unknown table", {"episodez": [Episode("x")]}, KeyError, ["episodez", "episodes"]),
    ("record of another table", {"tasks": [Episode("x")]}, SchemaError, ["tasks", "Task", "Episode"]),
    ("not a table", {"episodes": "e1,e2"}, SchemaError, ["episodes", "str"]),
    ("column given twice", {"episodes": pa.Table.from_arrays([pa.array(["a"]), pa.array(["b"])],
                                                             names=["episode_id", "episode_id"])},
     SchemaError, ["episodes", "twice"]),
    ("nothing to append", {}, TrajlakeError, ["at least one table"]),
]


def test_bad_appends_are_refused_and_store_unchanged(seeded):
    """Every case on one lake per backend (a fresh lake per case would cost a second each)."""
    before = state(seeded)
    failures = []
    for name, data, error, words in BAD_APPENDS:
        try:
            seeded.append(data, stage="test")
        except error as e:
            missing = [w for w in words if w not in str(e)]
            if missing:
                failures.append(f"{name}: {missing} not in message {str(e)!r}")
        except Exception as e:  # noqa: BLE001 - reported below with the case's name
            failures.append(f"{name}: raised {type(e).__name__}: {e}, expected {error.__name__}")
        else:
            failures.append(f"{name}: was accepted")
        if state(seeded) != before:
            failures.append(f"{name}: the store changed")
            before = state(seeded)
    assert not failures, "\n".join(failures)


def test_schema_errors_are_trajlake_errors():
    assert issubclass(SchemaError, TrajlakeError)


BAD_SECOND_TABLES = [
    {"turns": pa.table({"episode_id": ["e2"], "turn": ["zero"]})},
    {"turns": [Turn("e2", 0), Turn("e2", 0)]},
    {"episodez": [Episode("e3")]},
]


def test_multi_table_append_with_an_invalid_second_table_writes_nothing(seeded):
    before = state(seeded)
    for bad_second in BAD_SECOND_TABLES:
        data = {"episodes": [Episode("e2", num_turns=1), Episode("e3")], **bad_second}
        assert list(data)[0] == "episodes"  # the valid table comes first
        with pytest.raises((SchemaError, KeyError)):
            seeded.append(data, stage="test")
        assert state(seeded) == before, bad_second
        assert seeded.query("SELECT count(*) AS n FROM episodes WHERE episode_id IN ('e2', 'e3')")["n"][0] == 0


def test_bad_update_count_and_query_are_refused(seeded):
    before = state(seeded)
    with pytest.raises(TrajlakeError, match="key"):
        seeded.update("turns", {"episode_id": "e1"}, {"done": True}, stage="test")
    with pytest.raises(TrajlakeError, match="colour"):
        seeded.update("episodes", {"episode_id": "e1"}, {"colour": "red"}, stage="test")
    with pytest.raises(TrajlakeError, match="episode_id"):
        seeded.update("episodes", {"episode_id": "e1"}, {"episode_id": "e2"}, stage="test")
    with pytest.raises(KeyError, match="nope"):
        seeded.update("nope", {"id": 1}, {"x": 1}, stage="test")
    # an update matching no row makes no snapshot
    assert seeded.update("episodes", {"episode_id": "absent"}, {"status": "x"}, stage="test") is None
    assert state(seeded) == before
    # reading errors
    with pytest.raises(KeyError, match="episodez"):
        seeded.count("episodez")
    with pytest.raises(TrajlakeError, match="query failed"):
        seeded.query("SELECT no_such_column FROM episodes")
