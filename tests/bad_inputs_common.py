"""What the hostile suites (tests/test_bad_inputs*.py, tests/test_fuzz*.py) share: one lake per module and
backend with the files the cases point at, the lake's state, and `check_case`, which runs one command line
through `trajlake.cli.main` and asserts everything a refused input must leave true:

* the exit code (1 for a bad value, 2 for a usage error; 0 where the input is fine after all),
* exactly one `error: ` line on stderr naming the problem (beside `warning: ` lines), no traceback, and no
  "internal error" (the CLI's catch-all for a bug),
* the lake unchanged: the same snapshots and row counts, and the same data files on disk,
* no file written anywhere (the case's working folder, the lake's folder and the folder around it, into which
  `../` tricks climb), unless the case names the one folder it may write into.

On the DuckDB-file and SQLite catalogs the whole lake is files under the setting's root, so byte-identical files
(size and modification time of every file, the catalog included) mean identical snapshots and rows: each case
compares those, and the full snapshot/row-count state is compared at the module's end (and, where files differ,
at once, for a readable failure). A PostgreSQL catalog lives in the server: there every case compares the full
state.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import NamedTuple

import pytest

from trajlake.cli import main
from trajlake.schemas import TABLES, Episode
from trajlake.store import Lake

#: The protections other engineers were building while this suite was written: a case that fails only because
#: its area has not landed yet is marked xfail (not strict) under its key here. Remove a key once its area has
#: landed, and every case marked with it becomes a plain test again.
PENDING: dict[str, str] = {
}

#: the DuckDB-file lake in the fast suite; the multi-process catalogs in the slow one (CI runs both)
LAKE_BACKENDS = ["duckdb", pytest.param("sqlite", marks=pytest.mark.slow),
                 pytest.param("postgres", marks=pytest.mark.slow)]


class Case(NamedTuple):
    """One command line and what it must do. `argv` items are formatted with the setting's paths ({lake},
    {tmp}, {tiny}, {spec}, ...). `text` is a substring of the one error line (ignored for code 0). `pending`
    names a PENDING area. `writes` names the one folder (a setting key) the command may write into. `slow`
    cases run in the slow tier only (the same check as a fast case through another place)."""

    argv: tuple
    code: int | tuple  # a tuple: any of these codes (fuzzing, where which value is bad decides)
    text: str = ""
    pending: str | None = None
    writes: str | None = None
    id: str | None = None
    slow: bool = False


def case(argv, code, text="", *, pending=None, writes=None, id=None, slow=False) -> Case:
    return Case(tuple(argv), code, text, pending, writes, id, slow)


#: the marker of the cases that also run on SQLite and PostgreSQL (conftest.py deselects the rest there)
CATALOG_SAMPLE = "catalog_sample"


def params(cases: list[Case], *, catalog_every: int = 1, fast_every: int = 1) -> list:
    """The cases as pytest params, with readable ids (unique) and the PENDING xfail marks. Every case runs on
    the DuckDB-file lake; every `catalog_every`-th also on SQLite and PostgreSQL (the slow tier): most are
    refused before the lake is opened, where the catalog changes nothing, and the whole matrix on all three
    catalogs took over half an hour. Writes through user SQL and outputs into the lake are tested on every
    catalog in full by tests/test_sql_guard.py. Every `fast_every`-th case runs in the fast suite, the others in
    the slow one (`make test` stays under 8 minutes)."""
    out, seen = [], {}
    for i, c in enumerate(cases):
        base = c.id or " ".join(str(a) for a in c.argv if a not in ("--lake", "{lake}"))[:70]
        base = "".join(ch if ch.isprintable() else f"\\x{ord(ch):02x}" for ch in base)
        n = seen.get(base, 0)
        seen[base] = n + 1
        marks = [pytest.mark.slow] if c.slow or i % fast_every else []
        if i % catalog_every == 0:
            marks.append(getattr(pytest.mark, CATALOG_SAMPLE))
        if c.pending is not None and c.pending in PENDING:
            marks.append(pytest.mark.xfail(reason=f"pending: {PENDING[c.pending]}", strict=False))
        out.append(pytest.param(c, id=base if n == 0 else f"{base} #{n}", marks=marks))
    return out


def _lake_uri(backend: str, work: Path) -> tuple[str, str | None, Path | None]:
    """The lake's URI on `backend`, the PostgreSQL schema to drop afterwards, and the catalog file (if any)."""
    if backend == "duckdb":
        return str(work / "lake"), None, work / "lake" / "catalog.ducklake"
    if backend == "sqlite":
        return f"sqlite:{work / 'catalog.sqlite'}", None, work / "catalog.sqlite"
    from tests.conftest import _pg_available, pg_conninfo

    why = _pg_available()
    if why:
        pytest.skip(why)
    schema = "trajlake_bad_" + uuid.uuid4().hex[:10]
    return f"postgres:{pg_conninfo()} metadata_schema={schema} data_path={work / 'pgdata'}", schema, None


TRAIN_TOML = """algo = "sft"
model = "{tiny}"
run_id = "t-bad"
sft_filter = "success"
sft_steps = 1
minibatch_size = 1
micro_batch = 1
env = "doors"
max_turns = 1
"""


@pytest.fixture(scope="module", params=LAKE_BACKENDS)
def setting(request, tmp_path_factory, tiny):
    """A lake holding data files and inlined rows, beside the files cases point at. Layout: ROOT/work holds
    the lake and the inputs ({tmp}); ROOT itself is where `../` from {tmp} lands, and is watched too."""
    root = tmp_path_factory.mktemp("bad")
    work = root / "work"
    work.mkdir()
    lake, schema, catalog = _lake_uri(request.param, work)
    with Lake.open(lake) as lk:
        lk.append({"episodes": [Episode("e1", run_id="r1", env="doors", success=True)]}, stage="test", run_id="r1")
        lk.maintain()  # flushed: the lake has parquet data files whose set the cases watch
        lk.append({"episodes": [Episode("e2", run_id="r1", env="doors", success=False)]}, stage="test",
                  run_id="r1")  # and inlined rows
        data = Path(lk.catalog.data_path) if getattr(lk.catalog, "data_path", None) else None
    (work / "a-file.txt").write_text("not a lake\n")
    (work / "bad.toml").write_text("name = [unclosed\n")
    (work / "deep.toml").write_text("name = " + "[" * 5000 + "]" * 5000 + "\n")  # past tomllib's recursion
    (work / "one.jsonl").write_text('{"item_id": "x", "conversations": []}\n')
    (work / "out").mkdir()  # the folder a case that may write writes into
    spec = work / "spec.toml"
    spec.write_text('name = "s"\n[allocation]\nstrategy = "last_token"\n[[components]]\nkind = "goal"\n')
    (work / "train.toml").write_text(TRAIN_TOML.format(tiny=tiny))
    if data is None:
        data = next((p for p in work.rglob("*.parquet")), work).parent
    target = catalog if catalog is not None else data
    os.symlink(target, work / "link-to-catalog")
    os.symlink(data, work / "link-to-data")
    # hard links (what `cp -al lake backup` makes): the lake's files under names that resolve outside it
    data_file = next(Path(data).rglob("*.parquet"))
    os.link(catalog if catalog is not None else data_file, work / "hardlink-to-catalog")
    os.link(data_file, work / "hardlink-to-data.parquet")
    values = {"lake": lake, "tmp": str(work), "root": str(root), "tiny": str(tiny), "file": str(work / "a-file.txt"),
              "bad_toml": str(work / "bad.toml"), "deep_toml": str(work / "deep.toml"), "spec": str(spec),
              "jsonl": str(work / "one.jsonl"),
              "out": str(work / "out"), "catalog": str(target), "data": str(data),
              "train_toml": str(work / "train.toml"), "backend": request.param}
    start = lake_state(lake)
    yield values
    try:
        assert lake_state(lake) == start, "the module's cases changed the lake"
    finally:
        if schema:
            import psycopg

            from tests.conftest import pg_conninfo

            with psycopg.connect(pg_conninfo(), autocommit=True) as con:
                con.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def lake_state(uri: str) -> tuple:
    """The lake as a reader sees it: its snapshot ids and every table's row count."""
    with Lake.open(uri, read_only=True) as lake:
        return tuple(lake.snapshots()["snapshot_id"].to_list()), tuple(lake.count(t) for t in TABLES)


def disk_state(root: str | Path) -> dict[str, tuple[int, int]]:
    """Every file and link under `root` (not followed): path -> (size, modification time in ns)."""
    out = {}
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            p = os.path.join(folder, name)
            st = os.lstat(p)
            out[os.path.relpath(p, root)] = (st.st_size if not os.path.isdir(p) or os.path.islink(p) else 0,
                                             st.st_mtime_ns if not os.path.isdir(p) else 0)
    return out


def fill(argv, setting) -> list[str]:
    return [a.format(**setting) if isinstance(a, str) else str(a) for a in argv]


def check_case(c: Case, setting: dict, capsys, cwd: Path) -> None:
    """Run `c` and assert what a hostile input must leave true (module docstring)."""
    root = setting["root"]
    before = disk_state(root)
    # SQLite keeps -wal/-shm files beside its catalog and touches them on every open, writes or not: there the
    # catalog's files are left out of the comparison and the full state is compared instead (as on PostgreSQL)
    full_before = lake_state(setting["lake"]) if setting["backend"] != "duckdb" else None
    rc = main(fill(c.argv, setting))
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err + captured.out, captured.err
    lines = [line for line in captured.err.splitlines() if line.strip()]
    errors = [line for line in lines if not line.startswith("warning: ")]
    codes = c.code if isinstance(c.code, tuple) else (c.code,)
    assert rc in codes, captured.err or captured.out[-2000:]
    if rc == 0:
        assert not any(line.startswith("error:") for line in lines), lines
    else:
        assert len(errors) == 1, lines
        line = errors[0]
        assert line.startswith("error: ") and c.text in line, line
        assert "internal error" not in line, line
    log = os.environ.get("TRAJLAKE_HOSTILE_LOG")  # review every line a suite's cases print: a file to append to
    if log:
        with open(log, "a") as f:
            f.write(f"{rc} | {' '.join(map(repr, c.argv[2:]))[:150]} | {(errors or [''])[0][:300]}\n")
    after = disk_state(root)
    if setting["backend"] == "sqlite":
        catalog = os.path.relpath(setting["catalog"], root)
        after = {p: v for p, v in after.items() if not p.startswith(catalog)}
        before = {p: v for p, v in before.items() if not p.startswith(catalog)}
    if c.writes is not None:  # only inside the one folder it may write into
        inside = os.path.relpath(setting[c.writes], root)
        after = {p: v for p, v in after.items() if not (p == inside or p.startswith(inside + os.sep))}
        before = {p: v for p, v in before.items() if not (p == inside or p.startswith(inside + os.sep))}
    if after != before:
        changed = sorted(set(after.items()) ^ set(before.items()))
        state = lake_state(setting["lake"])
        raise AssertionError(f"files changed under {root}: {changed[:10]} (lake now {state})")
    if full_before is not None:
        assert lake_state(setting["lake"]) == full_before
    left = os.listdir(cwd)  # the working folder: a relative or empty path lands here
    assert not left, f"written into the working folder: {left}"


__all__ = ["LAKE_BACKENDS", "PENDING", "Case", "case", "check_case", "disk_state", "fill", "lake_state", "params",
           "setting"]
