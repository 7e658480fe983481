"""A process loads the catalog's DuckDB extensions once (store/extensions.py `acquire` / `release`): a closed lake's
instance is kept, detached, for the next lake, and nothing of the closed lake stays reachable through it."""

from __future__ import annotations

import os

import duckdb
import pytest

from trajlake.schemas import Episode
from trajlake.store import Lake, extensions
from trajlake.store.uri import parse_uri


def _databases(instance: duckdb.DuckDBPyConnection) -> set[str]:
    return {r[0] for r in instance.execute("SELECT database_name FROM duckdb_databases()").fetchall()}


def test_a_closed_lakes_instance_serves_the_next_lake_with_nothing_of_the_first(lake_uri, tmp_path):
    key = parse_uri(lake_uri).extensions
    with Lake.open(lake_uri) as first:
        first.append({"episodes": [Episode("e1", run_id="r1", env="doors", success=True)]}, stage="test",
                     run_id="r1")
        stale = first._cursor()
    idle = extensions._idle[key]
    instance = idle[-1]
    assert _databases(instance) == {"memory", "system", "temp"}  # the lake detached: nothing of it attached
    with pytest.raises(duckdb.ConnectionException):  # the closed lake's cursors are closed with it
        stale.execute("SELECT 1")
    with Lake.open(str(tmp_path / "other")) as other:  # another lake, maybe on another catalog
        assert other.count("episodes") == 0
    with Lake.open(lake_uri, read_only=True) as again:  # the same lake, on the kept instance
        assert instance not in extensions._idle[key]
        assert again.count("episodes") == 1
    assert instance in extensions._idle[key]


def test_an_instance_is_closed_not_kept_when_it_cannot_be_reused(tmp_path):
    con = extensions.acquire(())
    instance = extensions._in_use[id(con)][1]
    extensions.release(con, reuse=False)  # e.g. it holds object storage's secrets
    assert not any(instance is kept for kept in extensions._idle.get((), []))
    with pytest.raises(duckdb.ConnectionException):
        instance.execute("SELECT 1")


def test_at_most_max_idle_instances_are_kept(tmp_path):
    lakes = [Lake.open(str(tmp_path / f"lake{i}")) for i in range(extensions.MAX_IDLE + 2)]
    for lake in lakes:
        lake.close()
    assert len(extensions._idle[parse_uri(str(tmp_path / "lake0")).extensions]) == extensions.MAX_IDLE


def test_a_forked_child_never_uses_its_parents_instances(tmp_path):
    with Lake.open(str(tmp_path / "lake")):
        pass
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its first acquire drops the parent's idle instances and loads its own
        ok = False
        try:
            parents = [i for kept in extensions._idle.values() for i in kept]  # held: no id is reused
            key = parse_uri(str(tmp_path / "lake")).extensions
            con = extensions.acquire(key)
            mine = extensions._in_use[id(con)][1]
            ok = bool(parents) and not extensions._idle.get(key) and all(mine is not p for p in parents)
        finally:
            os.write(write, b"1" if ok else b"0")
            os._exit(0)
    os.waitpid(pid, 0)
    assert os.read(read, 1) == b"1"
