"""The record types mirror the Arrow schemas, and DDL is generated from them."""

import dataclasses

import pyarrow as pa
import pytest

from trajlake.schemas import RECORD_TYPES, TABLES, Episode, Turn, from_table, table_def, to_table
from trajlake.schemas.tables import duckdb_type


@pytest.mark.parametrize("name", sorted(TABLES))
def test_record_fields_equal_table_columns(name):
    fields = [f.name for f in dataclasses.fields(RECORD_TYPES[name])]
    assert fields == TABLES[name].schema.names
    assert dataclasses.fields(RECORD_TYPES[name])  # frozen dataclass
    assert RECORD_TYPES[name].__dataclass_params__.frozen


@pytest.mark.parametrize("name", sorted(TABLES))
def test_keys_are_required_columns(name):
    tdef = TABLES[name]
    for k in tdef.key:
        assert not tdef.schema.field(k).nullable


def test_ddl_types():
    ddl = table_def("turns").ddl("lake")
    assert "prompt_token_ids INTEGER[]" in ddl
    assert "response_logprobs FLOAT[]" in ddl
    assert "info JSON" in ddl
    assert "MAP(VARCHAR, DOUBLE)" in table_def("episode_rewards").ddl("lake")
    with pytest.raises(TypeError, match="no DuckDB type"):
        duckdb_type(pa.field("x", pa.binary()))


def test_unknown_table_lists_valid_ones():
    with pytest.raises(KeyError, match="episodes"):
        table_def("episode")


def test_to_table_and_back():
    turns = [Turn("e", 0, info={"k": [1, 2]}, prompt_token_ids=[1, 2], response_token_ids=[3],
                  response_logprobs=[-0.25])]
    table = to_table(turns)
    assert table.schema == TABLES["turns"].schema
    assert table["info"][0].as_py() == '{"k": [1, 2]}'
    assert from_table(table, "turns") == [Turn("e", 0, info={"k": [1, 2]}, prompt_token_ids=(1, 2),
                                               response_token_ids=(3,), response_logprobs=(-0.25,))]


def test_to_table_rejects_mixed_records():
    with pytest.raises(TypeError, match="Episode"):
        to_table([Episode("a"), Turn("a", 0)])
    with pytest.raises(ValueError, match="needs `table`"):
        to_table([])
