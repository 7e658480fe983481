"""bench/cli.py once: the rows measured in one run (trajlake's side and its baseline), each a positive time, the
ratio the quotient, and the lake it queries really holds the episodes it made."""

from __future__ import annotations

import json

import pytest

from tests.conftest import load_bench


def test_one_round_writes_both_rows(tmp_path, capsys):
    bench = load_bench("cli")
    out = tmp_path / "rows.json"
    bench.main(["--repeats", "1", "--json", str(out)])
    printed = capsys.readouterr().out
    rows = json.loads(out.read_text())
    assert [r["stage"] for r in rows] == ["cli: sql, one count on a small lake", "cli: --help",
                                          "store: a lake opened again in one process, and a count"]
    for r in rows:
        assert r["unit"] == "s" and r["trajlake_value"] > 0 and r["alternative_value"] > 0
        assert r["ratio"] == pytest.approx(r["alternative_value"] / r["trajlake_value"], rel=1e-2, abs=5e-4)
    assert "sql     median" in printed and "bare    median" in printed and "reopen  median" in printed


def test_both_sides_of_the_reopen_row_answer_the_same(tmp_path):
    """Each reopen side counts the lake's 200 episodes, whether the process opened a lake before or not."""
    from trajlake.store import Lake, extensions

    bench = load_bench("cli")
    lake = bench.make_lake(tmp_path)
    for _ in range(2):  # a first open, then one on the kept instance
        with Lake.open(str(lake), read_only=True) as lk:
            assert lk.query(bench.QUERY)["n"].to_list() == [200]
    con = extensions.connect(("ducklake",))
    con.execute(f"ATTACH 'ducklake:{lake}/catalog.ducklake' AS lake (READ_ONLY, DATA_PATH '{lake}/data')")
    assert con.execute("SELECT count(*) FROM lake.episodes").fetchall() == [(200,)]
    con.close()


def test_both_sides_of_the_sql_row_answer_the_same(tmp_path):
    """The baseline is the same query on the same lake: both print the same count."""
    import subprocess
    import sys

    from trajlake.store.extensions import extension_path

    bench = load_bench("cli")
    lake = bench.make_lake(tmp_path)
    ours = subprocess.run([sys.executable, "-m", "trajlake", "--lake", str(lake), "--format", "csv", "sql",
                           bench.QUERY], capture_output=True, text=True, check=True).stdout.split()
    bare = subprocess.run([sys.executable, "-c", bench.BARE, str(lake), bench.QUERY, str(extension_path("ducklake"))],
                          capture_output=True, text=True, check=True).stdout
    assert ours == ["n", "200"] and bare.strip() == "[(200,)]"
