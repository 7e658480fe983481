"""An import is a run with an identity (interop/importers/config.py): a run id stored as another kind of run, or as
an import of other files (or another tokenizer, policy, env or split), is refused with nothing written; the same
files moved, or chunked otherwise, are the same run."""

from __future__ import annotations

import pytest

from tests.helpers import tiny_model_dir
from tests.test_import_agentgym import _row, _write
from trajlake.interop.importers import TrajectoryImportError, import_agentgym
from trajlake.store import Lake


@pytest.fixture(scope="module")
def tok_path(tmp_path_factory):
    """The tiny model's folder: its tokenizer tokenizes the imports."""
    return tiny_model_dir(tmp_path_factory)


def _state(lake) -> tuple:
    return lake.current_snapshot(), {t: lake.count(t) for t in ("episodes", "turns", "tasks", "runs", "policies")}


def test_a_run_id_of_another_kind_of_run_is_refused(tmp_path, tok_path):
    from trajlake.collect.config import CollectConfig
    from trajlake.collect.rollout import collect

    lake = Lake.open(str(tmp_path / "lake"))
    collect(CollectConfig(env="doors", policy="scripted:doors", tokenizer=str(tok_path), tasks=2, run_id="played",
                          progress=False), lake)
    before = _state(lake)
    with pytest.raises(TrajectoryImportError, match=r"^run played already exists as a collect run, not an import run "
                                                    r"\(use a new --run-id\)$"):
        import_agentgym(lake, _write(tmp_path / "a.jsonl", [_row(1)]), str(tok_path), run_id="played", progress=False)
    assert _state(lake) == before
    assert lake.query("SELECT DISTINCT kind FROM runs")["kind"].to_list() == ["collect"]


def test_other_files_under_an_import_run_id_are_refused(tmp_path, tok_path):
    lake = Lake.open(str(tmp_path / "lake"))
    first = _write(tmp_path / "first.jsonl", [_row(1), _row(2)])
    import_agentgym(lake, first, str(tok_path), run_id="expert", progress=False)
    before = _state(lake)
    other = _write(tmp_path / "other.jsonl", [_row(3)])
    for paths in (other, [first, other]):  # other files, or more files than the run was made of
        with pytest.raises(TrajectoryImportError, match=r"^run expert already exists with files \['[0-9a-f]+"):
            import_agentgym(lake, paths, str(tok_path), run_id="expert", progress=False)
        assert _state(lake) == before
    with pytest.raises(TrajectoryImportError, match=r"^run expert already exists with env None; given 'maze' "):
        import_agentgym(lake, first, str(tok_path), run_id="expert", env="maze", progress=False)
    assert _state(lake) == before


def test_the_same_files_moved_and_chunked_otherwise_are_the_same_run(tmp_path, tok_path):
    lake = Lake.open(str(tmp_path / "lake"))
    first = _write(tmp_path / "first.jsonl", [_row(1), _row(2)])
    import_agentgym(lake, first, str(tok_path), run_id="expert", progress=False)
    before = _state(lake)
    (tmp_path / "moved").mkdir()
    moved = first.rename(tmp_path / "moved" / "renamed.jsonl")
    again = import_agentgym(lake, moved, str(tok_path), run_id="expert", chunk_size=1, progress=False)
    assert again.episodes_skipped == 2 and sum(again.inserted.values()) == 0 and _state(lake) == before


def test_the_cli_refuses_another_kind_of_run_in_one_line(tmp_path, tok_path):
    import subprocess
    import sys

    lake = Lake.open(str(tmp_path / "lake"))
    from trajlake.collect.config import CollectConfig
    from trajlake.collect.rollout import collect

    collect(CollectConfig(env="doors", policy="scripted:doors", tokenizer=str(tok_path), tasks=2, run_id="played",
                          progress=False), lake)
    before = _state(lake)
    lake.close()
    rows = _write(tmp_path / "a.jsonl", [_row(1)])
    p = subprocess.run([sys.executable, "-m", "trajlake", "--lake", str(tmp_path / "lake"), "import", "agentgym",
                        str(rows), "--tokenizer", str(tok_path), "--run-id", "played"],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode != 0
    assert p.stderr.strip().splitlines()[-1] == \
        "error: run played already exists as a collect run, not an import run (use a new --run-id)", p.stderr
    with Lake.open(str(tmp_path / "lake")) as lake:
        assert _state(lake) == before
