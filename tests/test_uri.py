"""Catalog URIs: folders (DuckDB-file catalog), sqlite:FILE and postgres:CONNINFO, and their errors."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from trajlake.core.errors import CatalogError
from trajlake.schemas import Episode
from trajlake.store import Lake, parse_uri
from trajlake.store.uri import ENV_VAR


def test_default_is_trajlake_lake_then_lake_folder(tmp_path, monkeypatch):
    monkeypatch.setenv(ENV_VAR, str(tmp_path / "from-env"))
    assert parse_uri(None).metadata == str(tmp_path / "from-env" / "catalog.ducklake")
    monkeypatch.setenv(ENV_VAR, "sqlite:env.sqlite")
    assert parse_uri(None).backend == "sqlite"
    monkeypatch.setenv(ENV_VAR, "")
    assert parse_uri(None).metadata == str(tmp_path / "lake" / "catalog.ducklake")  # cwd is tmp_path
    monkeypatch.delenv(ENV_VAR)
    c = parse_uri(None)
    assert (c.backend, c.data_path) == ("duckdb", str(tmp_path / "lake" / "data") + "/")
    assert parse_uri("explicit").metadata == str(tmp_path / "explicit" / "catalog.ducklake")


def test_folder(tmp_path, monkeypatch):
    c = parse_uri("some/lake")
    assert c.backend == "duckdb" and not c.multi_process
    assert c.metadata == str(tmp_path / "some" / "lake" / "catalog.ducklake")
    assert c.data_path == str(tmp_path / "some" / "lake" / "data") + "/"
    assert c.raw == "some/lake" and c.metadata_schema is None
    assert parse_uri(tmp_path / "p").metadata == str(tmp_path / "p" / "catalog.ducklake")  # a PathLike
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert parse_uri("~/lk").metadata == str(tmp_path / "home" / "lk" / "catalog.ducklake")
    # an existing folder whose name holds a colon is a folder, not a scheme
    (tmp_path / "runs:2024").mkdir()
    assert parse_uri("runs:2024").backend == "duckdb"


def test_sqlite(tmp_path):
    c = parse_uri("sqlite:cat/lake.sqlite")
    assert c.backend == "sqlite" and c.multi_process
    assert c.metadata == f"sqlite:{tmp_path / 'cat' / 'lake.sqlite'}"
    assert c.data_path == str(tmp_path / "cat" / "lake.sqlite") + ".data/"
    assert parse_uri("sqlite:/abs/x.db").metadata == "sqlite:/abs/x.db"


def test_postgres_with_and_without_our_keys(tmp_path):
    c = parse_uri("postgres:dbname=trajlake host=10.0.0.5 user=me")
    assert c.backend == "postgres" and c.multi_process
    assert c.metadata == "postgres:dbname=trajlake host=10.0.0.5 user=me"
    assert c.metadata_schema is None
    assert c.data_path == str(tmp_path / "lake_data") + "/"

    c = parse_uri("postgres:host=h data_path=s3://bucket/lake dbname=d metadata_schema=team_a port=5433")
    assert c.metadata == "postgres:host=h dbname=d port=5433"  # our keys are not passed to libpq
    assert c.data_path == "s3://bucket/lake/"
    assert c.metadata_schema == "team_a"
    assert "METADATA_SCHEMA 'team_a'" in c.attach_sql("lake")
    assert "DATA_PATH 's3://bucket/lake/'" in c.attach_sql("lake")
    assert parse_uri("postgresql:dbname=d").backend == "postgres"
    assert parse_uri("postgres:dbname=d data_path=/mnt/lake/").data_path == "/mnt/lake/"


def test_attach_sql_quotes_paths(tmp_path):
    c = parse_uri("it's a lake")
    sql = c.attach_sql("lake")
    assert "it''s a lake/catalog.ducklake'" in sql and "it''s a lake/data/'" in sql


@pytest.mark.parametrize("uri,words", [
    ("s3://bucket/lake", ["unknown", "'s3'"]),
    ("mysql:db=x", ["unknown", "'mysql'"]),
    ("sqlite:", ["sqlite:", "file path"]),
    ("postgres:host=127.0.0.1 user=me", ["dbname"]),
    ("postgres:", ["dbname"]),
    ("postgres:dbname=x localhost", ["'localhost'", "key=value"]),
    ("", ["empty"]),
    ("   ", ["empty"]),
])
def test_malformed_uris(uri, words):
    with pytest.raises(CatalogError) as info:
        parse_uri(uri)
    for w in words:
        assert w in str(info.value), str(info.value)


def test_lake_path_that_is_a_file(tmp_path):
    (tmp_path / "notes.txt").write_text("not a lake")
    with pytest.raises(CatalogError, match="is a file"):
        parse_uri("notes.txt")
    with pytest.raises(CatalogError, match="is a file"):
        Lake.open(tmp_path / "notes.txt")


def test_open_by_uri_on_every_backend(lake_uri, tmp_path):
    with Lake.open(lake_uri) as lake:
        expected = "duckdb" if ":" not in lake_uri else lake_uri.split(":", 1)[0]
        assert lake.catalog.backend == expected
        assert lake.catalog.raw == lake_uri
        lake.append({"episodes": [Episode("e1")]}, stage="test")
        data = lake.catalog.data_path
    assert Path(data).is_dir()
    if expected == "sqlite":
        # the catalog runs in WAL mode, so concurrent writers do not deadlock
        path = lake_uri.removeprefix("sqlite:")
        with sqlite3.connect(path) as con:
            assert con.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    with Lake.open(lake_uri) as again:
        assert again.count("episodes") == 1


def test_default_lake_is_trajlake_lake(tmp_path, monkeypatch):
    with Lake.open() as lake:  # conftest points TRAJLAKE_LAKE at tmp_path/lake
        assert lake.catalog.metadata == str(tmp_path / "lake" / "catalog.ducklake")
    assert (tmp_path / "lake" / "catalog.ducklake").is_file()
    monkeypatch.delenv(ENV_VAR)
    monkeypatch.chdir(tmp_path / "lake")
    with Lake.open() as nested:
        assert nested.catalog.metadata == str(tmp_path / "lake" / "lake" / "catalog.ducklake")


def test_sqlite_catalog_in_a_new_folder(tmp_path):
    with Lake.open("sqlite:sub/dir/catalog.sqlite") as lake:
        lake.append({"episodes": [Episode("e1")]}, stage="test")
    assert (tmp_path / "sub" / "dir" / "catalog.sqlite").is_file()
    assert (tmp_path / "sub" / "dir" / "catalog.sqlite.data").is_dir()
    assert not (tmp_path / "sqlite:").exists()  # the folder made is the file's, not one named after the URI


def test_unreachable_postgres_is_a_catalog_error():
    with pytest.raises(CatalogError, match="cannot open lake"):
        Lake.open("postgres:dbname=test host=127.0.0.1 port=1 connect_timeout=2 data_path=pgdata")


def test_catalog_backends_are_one_registry():
    """A catalog is one registration: its schemes, what DuckLake needs of it; an unknown scheme lists them."""
    from trajlake.core.errors import CatalogError
    from trajlake.store.uri import CATALOGS

    assert CATALOGS.names() == ["duckdb", "postgres", "sqlite"]
    with pytest.raises(ValueError, match="catalog backend 'sqlite' is already registered"):
        CATALOGS.add("sqlite", CATALOGS["sqlite"])
    with pytest.raises(CatalogError, match=r"unknown lake URI scheme 'mysql': use a folder, or one of sqlite:\.\.\., "
                                           r"postgres:\.\.\., postgresql:\.\.\."):
        parse_uri("mysql:host=x")
    assert parse_uri("sqlite:x.sqlite").kind.prepare is not None and parse_uri("lake").kind.folder_lake
