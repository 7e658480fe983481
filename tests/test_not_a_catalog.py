"""A catalog file that is not a database (a text file given as the lake) is one `error: ` line naming it, for
write commands (import, collect, maintain) and read ones alike, and nothing is made or changed beside it (it
ended as "internal error (DatabaseError: file is not a database)" for a sqlite: lake, after the lake's data
folder was made)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from tests.bad_inputs_common import disk_state


def _argv(command: str, tmp, tiny) -> list[str]:
    rows = tmp / "rows.jsonl"
    rows.write_text(json.dumps({"item_id": "t_1", "conversations": [
        {"from": "human", "value": "Goal."}, {"from": "gpt", "value": "Action: go"}]}) + "\n")
    return {
        "import": ["import", "agentgym", str(rows), "--tokenizer", str(tiny)],
        "collect": ["collect", "--env", "guess", "--policy", "scripted:guess", "--tasks", "1", "--tokenizer",
                    str(tiny)],
        "maintain": ["maintain"],
        "tables": ["tables"],
    }[command]


@pytest.mark.parametrize("command", ["import", "collect", "maintain", "tables"])
@pytest.mark.parametrize("backend", ["folder", "sqlite"])
def test_a_catalog_that_is_not_a_database_is_one_line(backend, command, tiny, tmp_path, capsys):
    from trajlake.cli import main

    if backend == "folder":  # a DuckDB-file lake's folder whose catalog file is text
        (tmp_path / "lake").mkdir()
        catalog, uri, kind = tmp_path / "lake" / "catalog.ducklake", str(tmp_path / "lake"), "DuckDB"
    else:
        catalog, kind = tmp_path / "notes.txt", "SQLite"
        uri = f"sqlite:{catalog}"
    catalog.write_text("these are my notes, not a lake\n")
    argv = _argv(command, tmp_path, tiny)
    digest, before = hashlib.sha256(catalog.read_bytes()).hexdigest(), disk_state(catalog.parent)
    rc = main(["--lake", uri, *argv])
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert rc == 1 and len(lines) == 1, err
    assert lines[0] == f"error: cannot open lake {uri}: {catalog} is not a {kind} database (a file of another " \
                       "kind); a new lake needs a new path", lines[0]
    assert hashlib.sha256(catalog.read_bytes()).hexdigest() == digest
    assert disk_state(catalog.parent) == before  # no data folder, no -wal file


def test_an_empty_catalog_file_is_still_a_new_lake(tmp_path):
    """An empty file is left to the database, which makes its catalog in it (as `touch lake.sqlite` first)."""
    from trajlake.store import Lake

    (tmp_path / "lake.sqlite").touch()
    with Lake.open(f"sqlite:{tmp_path / 'lake.sqlite'}") as lake:
        assert lake.count("episodes") == 0


@pytest.mark.parametrize("command", ["import", "collect"])
def test_a_catalog_that_is_a_fifo_is_one_line_and_nothing_is_made_beside_it(command, tiny, tmp_path, capsys):
    """`sqlite:/dev/null` opened a database on the device and made `/dev/null.data` and `/dev/null-journal`: a
    catalog path that is a device, FIFO or socket is refused before anything is made (a FIFO here: tests do not
    write into /dev)."""
    import os

    from trajlake.cli import main

    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    rc = main(["--lake", f"sqlite:{fifo}", *_argv(command, tmp_path, tiny)])
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert rc == 1 and len(lines) == 1 and "is not a file (a device, FIFO or socket)" in lines[0], lines
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pipe", "rows.jsonl"]


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux's /proc, where no file can be made")
def test_a_sqlite_catalog_where_no_file_can_be_made_is_one_line(tiny, tmp_path, capsys):
    from trajlake.cli import main

    rc = main(["--lake", "sqlite:/proc/no-such.sqlite", *_argv("collect", tmp_path, tiny)])
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert rc == 1 and len(lines) == 1 and "cannot open lake sqlite:/proc/no-such.sqlite" in lines[0], lines
    assert "internal error" not in lines[0]
