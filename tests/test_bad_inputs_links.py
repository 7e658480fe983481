"""No second way into the lake (issue 35): the lake's files under other names, as outputs.

A hard link to the catalog or a data file (what `cp -al lake backup` makes) resolves outside the lake, so a check
by path let `sql -o` and `export --query` truncate the catalog in place. Here every output option is given such
a link and must refuse it in one line, leaving every lake file byte-identical (hashed, not only sized); a link
outside the lake is written correctly with its other name keeping the old content (writes go beside the target
and are renamed over it); a symlink loop is refused by name; a train config's checkpoint_dir inside the lake is
refused before anything is written. The DuckDB-file and SQLite catalogs run in the fast suite, PostgreSQL (its
data path local) in the slow one. The generated matrix (tests/test_bad_inputs_paths.py) gives the same links to
every output on the shared lake; bad run ids are in tests/test_bad_inputs_cli.py.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from tests.bad_inputs_common import TRAIN_TOML, lake_state
from trajlake.cli import main
from trajlake.schemas import Episode
from trajlake.store import Lake
from trajlake.store.outputs import OutputPathError

#: every output a user names: (name, argv with {path})
OUTPUTS = [
    ("sql -o", ["sql", "SELECT 1 AS x", "-f", "csv", "-o", "{path}"]),
    ("sql -o parquet", ["sql", "SELECT 1 AS x", "-f", "parquet", "-o", "{path}"]),
    ("export --query", ["export", "{path}", "--query", "SELECT 1 AS x"]),
    ("export --dataset", ["export", "{path}", "--dataset"]),
    ("view --out", ["view", "--out", "{path}"]),
    ("report --out", ["report", "--out", "{path}"]),
    ("model tiny --out", ["model", "tiny", "--out", "{path}"]),
]


@pytest.fixture(scope="module", params=["duckdb", "sqlite", pytest.param("postgres", marks=pytest.mark.slow)])
def linked(request, tmp_path_factory):
    """A lake with data files, and hard links to its catalog and to a data file from a folder beside it."""
    from tests.bad_inputs_common import _lake_uri

    work = tmp_path_factory.mktemp("links")
    uri, schema, catalog = _lake_uri(request.param, work)
    with Lake.open(uri) as lk:
        lk.append({"episodes": [Episode("e1", run_id="r1", env="doors", success=True)]}, stage="test", run_id="r1")
        lk.maintain()  # flushed into parquet data files
        data = Path(lk.catalog.data_path)
    data_file = next(data.rglob("*.parquet"))
    links = {"data": work / "backup-data.parquet"}
    os.link(data_file, links["data"])
    if catalog is not None:
        links["catalog"] = work / "backup-catalog"
        os.link(catalog, links["catalog"])
    yield {"uri": uri, "catalog": catalog, "data": data, "work": work, "links": links, "backend": request.param}
    if schema:
        import psycopg

        from tests.conftest import pg_conninfo

        with psycopg.connect(pg_conninfo(), autocommit=True) as con:
            con.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def lake_hashes(lake: dict) -> dict[str, str]:
    """sha256 of the catalog file and of every data file. SQLite's -wal and -shm files are left out: SQLite
    makes and touches them on every open, read-only ones included (the catalog itself it leaves alone)."""
    files = [lake["catalog"]] if lake["catalog"] is not None else []
    files += sorted(p for p in lake["data"].rglob("*") if p.is_file())
    return {str(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in files}


def run(lake: dict, argv: list[str], capsys) -> tuple[int, list[str]]:
    rc = main(["--lake", lake["uri"], *argv])
    err = capsys.readouterr().err
    assert "Traceback" not in err and "internal error" not in err, err
    return rc, [line for line in err.splitlines() if line.strip() and not line.startswith("warning: ")]


@pytest.mark.parametrize("which", ["catalog", "data"])
@pytest.mark.parametrize("name,argv", OUTPUTS, ids=[o[0] for o in OUTPUTS])
def test_a_hard_link_to_a_lake_file_is_refused_as_every_output(linked, which, name, argv, capsys):
    if which not in linked["links"]:
        pytest.skip("a PostgreSQL catalog is no file")
    link = linked["links"][which]
    before, link_before = lake_hashes(linked), link.read_bytes()
    rc, lines = run(linked, [a.replace("{path}", str(link)) for a in argv], capsys)
    assert rc == 1 and len(lines) == 1, lines
    assert lines[0].startswith("error: ") and "the lake's file" in lines[0] and "under another name" in lines[0], lines
    assert str(link) in lines[0]
    assert lake_hashes(linked) == before and link.read_bytes() == link_before


@pytest.mark.parametrize("argv", [["sql", "SELECT 42 AS x", "-f", "csv", "-o"],
                                  ["sql", "SELECT 42 AS x", "-f", "parquet", "-o"],
                                  ["export", "--query", "SELECT 42 AS x"]], ids=["sql csv", "sql parquet", "export"])
def test_a_hard_link_outside_the_lake_is_written_and_its_other_name_keeps_its_content(linked, argv, tmp_path,
                                                                                     capsys):
    """The user's own file with a second name: the file named gets the output (and keeps its private mode),
    the other name keeps what it held, and no temporary file is left beside it."""
    if linked["backend"] != "duckdb":
        pytest.skip("how a file is written does not depend on the catalog")
    mine, other = tmp_path / "mine.out", tmp_path / "other.out"
    mine.write_bytes(b"old content\n")
    mine.chmod(0o600)
    os.link(mine, other)
    argv = argv + [str(mine)] if argv[0] == "sql" else ["export", str(mine), *argv[1:]]
    rc, lines = run(linked, argv, capsys)
    assert rc == 0, lines
    assert other.read_bytes() == b"old content\n"
    assert b"42" in mine.read_bytes() or mine.read_bytes()[:4] == b"PAR1"
    assert os.stat(mine).st_nlink == 1 and (os.stat(mine).st_mode & 0o777) == 0o600
    assert sorted(os.listdir(tmp_path)) == ["mine.out", "other.out"]


#: the outputs that name a folder, with the file name each writes first in it
FOLDER_OUTPUTS = [(name, argv) for name, argv in OUTPUTS if name in ("view --out", "report --out",
                                                                    "model tiny --out", "export --dataset")]


@pytest.mark.parametrize("planted", ["hard link", "symlink"])
@pytest.mark.parametrize("name,argv", FOLDER_OUTPUTS, ids=[o[0] for o in FOLDER_OUTPUTS])
def test_a_folder_holding_a_lake_file_under_another_name_is_refused(linked, planted, name, argv, tmp_path, capsys):
    """An existing output folder holding another name of a lake file at a name its writer takes (a model's
    config.json, the viewer's index.html): save_pretrained writes such files in place, through the link, and
    destroyed the catalog. Refused in one line naming the entry, nothing written, the lake byte-identical."""
    if "catalog" not in linked["links"]:
        pytest.skip("a PostgreSQL catalog is no file")
    site = tmp_path / "site"
    site.mkdir()
    for entry in ("config.json", "index.html", "report.html", "dataset_info.json"):
        if planted == "hard link":
            os.link(linked["links"]["catalog"], site / entry)
        else:
            (site / entry).symlink_to(linked["catalog"])
    before = lake_hashes(linked)
    rc, lines = run(linked, [a.replace("{path}", str(site)) for a in argv], capsys)
    assert rc == 1 and len(lines) == 1, lines
    assert "under another name" in lines[0] and str(site) in lines[0], lines
    assert lake_hashes(linked) == before
    assert sorted(p.name for p in site.iterdir()) == ["config.json", "dataset_info.json", "index.html",
                                                       "report.html"]


def test_checkpoint_dir_holding_a_lake_file_under_another_name_is_refused(linked, tiny, tmp_path, capsys):
    """A train config's existing checkpoint_dir with a hard link to the catalog inside: refused before the
    lease, the model or the engines (DeepSpeed and tensorboard write in place)."""
    if "catalog" not in linked["links"]:
        pytest.skip("a PostgreSQL catalog is no file")
    ckpt = tmp_path / "ckpt"
    (ckpt / "step-1").mkdir(parents=True)
    os.link(linked["links"]["catalog"], ckpt / "step-1" / "model.safetensors")
    config = tmp_path / "train.toml"
    config.write_text(TRAIN_TOML.format(tiny=tiny) + f'checkpoint_dir = "{ckpt}"\n')
    state, hashes = lake_state(linked["uri"]), lake_hashes(linked)
    rc, lines = run(linked, ["train", "--config", str(config)], capsys)
    assert rc == 1 and len(lines) == 1 and "checkpoint_dir" in lines[0] and "under another name" in lines[0], lines
    assert lake_state(linked["uri"]) == state and lake_hashes(linked) == hashes


def test_an_output_folder_past_the_entry_cap_is_refused(linked, tmp_path, monkeypatch, capsys):
    from trajlake.store import outputs

    if linked["backend"] != "duckdb":
        pytest.skip("the walk does not depend on the catalog")
    monkeypatch.setattr(outputs, "MAX_FOLDER_ENTRIES", 3)
    site = tmp_path / "site"
    site.mkdir()
    for i in range(4):
        (site / f"f{i}").write_text("x")
    rc, lines = run(linked, ["view", "--out", str(site)], capsys)
    assert rc == 1 and len(lines) == 1 and "more than 3 entries" in lines[0], lines


@pytest.mark.parametrize("name,argv", OUTPUTS, ids=[o[0] for o in OUTPUTS])
def test_a_symlink_loop_is_refused_by_name(linked, name, argv, tmp_path, capsys):
    if linked["backend"] != "duckdb":
        pytest.skip("the loop is refused before the catalog matters")
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    for path in (tmp_path / "a", tmp_path / "a" / "x"):
        rc, lines = run(linked, [a.replace("{path}", str(path)) for a in argv], capsys)
        assert rc == 1 and len(lines) == 1, lines
        assert "symlink loop" in lines[0] and str(path) in lines[0], lines
    assert sorted(os.listdir(tmp_path)) == ["a", "b"]


def _inside(linked: dict) -> list[tuple[str, Path]]:
    """Folders inside the lake a checkpoint_dir may name: its data path, a folder under it, and (a file
    catalog) the folder beside the catalog that is its sidecar, or the DuckDB lake's own folder."""
    out = [("the data path", linked["data"]), ("under the data path", linked["data"] / "ckpt")]
    if linked["backend"] == "duckdb":
        out.append(("the lake folder", linked["catalog"].parent / "ckpt"))
    if linked["backend"] == "sqlite":
        out.append(("beside the catalog", Path(f"{linked['catalog']}-ckpt")))
    return out


def test_checkpoint_dir_inside_the_lake_is_refused(linked, tiny, tmp_path, capsys):
    """`trajlake train` with checkpoint_dir in the lake: one line naming the field and the lake, before the
    lease, the model or the engines; the lake unchanged, no checkpoint folder made."""
    for where, folder in _inside(linked):
        config = tmp_path / "train.toml"
        config.write_text(TRAIN_TOML.format(tiny=tiny) + f'checkpoint_dir = "{folder}"\n')
        state, hashes = lake_state(linked["uri"]), lake_hashes(linked)
        rc, lines = run(linked, ["train", "--config", str(config)], capsys)
        assert rc == 1 and len(lines) == 1, (where, lines)
        assert "checkpoint_dir" in lines[0] and "inside the lake" in lines[0], (where, lines)
        assert lake_state(linked["uri"]) == state and lake_hashes(linked) == hashes, where
        assert not (folder.exists() and folder != linked["data"]), where


def test_a_recipe_folder_inside_the_lake_is_refused_before_its_first_stage(linked):
    from trajlake.recipes.entry import check_folders

    check_folders(linked["uri"], report=linked["work"] / "report", checkpoints=linked["work"] / "ckpt")
    with pytest.raises(OutputPathError, match="--checkpoints .* is inside the lake"):
        check_folders(linked["uri"], report=linked["work"] / "report", checkpoints=linked["data"] / "ckpt")
    if "catalog" in linked["links"]:
        with pytest.raises(OutputPathError, match="--report .* under another name"):
            check_folders(linked["uri"], report=linked["links"]["catalog"])


def test_a_lake_folder_under_another_name_is_refused(linked, tmp_path, capsys):
    """The data folder bind-mounted elsewhere: the path resolves outside the lake, the folder is the lake's
    (same device and inode). Needs a bind mount (root, or a mount namespace): skipped where none can be made."""
    import subprocess

    if linked["backend"] != "duckdb":
        pytest.skip("the folder identity does not depend on the catalog")
    view = tmp_path / "view"
    view.mkdir()
    try:
        made = subprocess.run(["mount", "--bind", str(linked["data"]), str(view)], capture_output=True, check=False)
    except OSError as e:  # no mount command
        pytest.skip(f"no bind mount here: {e}")
    if made.returncode:
        pytest.skip(f"no bind mount here: {made.stderr.decode(errors='replace').strip()[:100]}")
    try:
        before = lake_hashes(linked)
        for argv in (["sql", "SELECT 1", "-o", f"{view}/x.csv"], ["report", "--out", f"{view}/report"]):
            rc, lines = run(linked, argv, capsys)
            assert rc == 1 and len(lines) == 1 and "under another name" in lines[0] and "the lake's" in lines[0], lines
        assert lake_hashes(linked) == before
    finally:
        subprocess.run(["umount", str(view)], check=False)


def test_the_lake_in_an_output_folder_under_its_own_name_is_passed_over(tiny, tmp_path, capsys):
    """`view --out .` beside `./lake`: the lake lying in the folder is no other name of it, and the pages are
    written beside it. But a train run whose own folder in checkpoint_dir is the lake's (checkpoint_dir the
    lake's parent, run id the lake folder's name) is refused before anything is written."""
    here = tmp_path / "here"
    with Lake.open(str(here / "lake")) as lk:
        lk.append({"episodes": [Episode("e1", run_id="r1", env="doors", success=True)]}, stage="test", run_id="r1")
        lk.maintain()
    lake = {"uri": str(here / "lake"), "catalog": here / "lake" / "catalog.ducklake", "data": here / "lake" / "data"}
    before = lake_hashes(lake)
    rc, lines = run(lake, ["view", "--out", str(here)], capsys)
    assert rc == 0, lines
    assert (here / "index.html").is_file() and lake_hashes(lake) == before
    config = tmp_path / "train.toml"
    config.write_text(TRAIN_TOML.format(tiny=tiny).replace('run_id = "t-bad"', 'run_id = "lake"')
                      + f'checkpoint_dir = "{here}"\n')
    rc, lines = run(lake, ["train", "--config", str(config)], capsys)
    assert rc == 1 and len(lines) == 1 and "checkpoint folder" in lines[0] and "inside the lake" in lines[0], lines
    assert lake_hashes(lake) == before
