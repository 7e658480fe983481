"""Bounded imports (interop/importers/limits.py, records.py, json_stream.py): every imported row is measured before
it is parsed and held to the caps (row size, a text's size, nesting, finite numbers, no lone surrogate). Each
refusal is one `error: ` line naming the file, the row and the cap or the field, exit 1, and the lake's files as
they were; a row over the caps costs memory of the order of the cap, not of the row (a 50 MB message grew an
import past 6 GB)."""

from __future__ import annotations

import io
import json
import random
import re
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.bad_inputs_common import disk_state
from trajlake.interop.importers import json_stream
from trajlake.interop.importers.json_stream import JSONListError, json_list_elements
from trajlake.interop.importers.limits import DEFAULT_FIELD_MB, DEFAULT_ROW_MB, MB, Limits, TrajectoryImportError

GOOD = {"item_id": "t_1", "data_source": "caps", "conversations": [
    {"from": "human", "value": "Goal: x."}, {"from": "gpt", "value": "Action: go", "loss": True}]}


def _with_text(text: str, **over) -> dict:
    return {**GOOD, "conversations": [{"from": "human", "value": text}, GOOD["conversations"][1]], **over}


def _write(path: Path, rows: list, **parquet) -> Path:
    if path.suffix == ".jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    elif path.suffix == ".json":
        path.write_text(json.dumps(rows))
    else:
        pq.write_table(pa.Table.from_pylist(rows), path, **parquet)
    return path


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    from trajlake.store import Lake

    root = tmp_path_factory.mktemp("caps")
    Lake.open(str(root / "lake")).close()  # an existing lake: a refusal must leave its files as they were
    return root


def _refused(argv: list[str], root: Path, capsys) -> str:
    """Run the CLI; assert exit 1, one `error: ` line and the lake's files unchanged; return the line."""
    from trajlake.cli import main

    before = disk_state(root / "lake")
    rc = main(["--lake", str(root / "lake"), *argv])
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert rc == 1 and len(lines) == 1 and lines[0].startswith("error: "), err
    assert "internal error" not in lines[0] and "Traceback" not in err
    assert disk_state(root / "lake") == before, "a refused import changed the lake"
    return lines[0]


# ---- what each file kind refuses, one line naming the file, the row and the cap -------------------------
BIG = "x" * (50 * MB)


def _case(kind: str, d: Path) -> tuple[Path, list[str], str]:
    """(file, extra options, a regex the error line matches) for one refused input."""
    cases = {
        # 50 MB in one message: refused from the row's size before it is parsed
        "jsonl_row": (lambda p: _write(p, [GOOD, _with_text(BIG)]), ".jsonl", [],
                      r"rows\.jsonl line 2: the row is longer than the 4\.0 MB row cap \(--max-row-mb"),
        "json_row": (lambda p: _write(p, [GOOD, _with_text(BIG)]), ".json", [],
                     r"rows\.json row 1: the row is longer than the 4\.0 MB row cap"),
        # a parquet row in its own row group: refused from the metadata, before Arrow decompresses it
        "parquet_group": (lambda p: _write(p, [GOOD, _with_text(BIG)], row_group_size=1, compression="zstd"),
                          ".parquet", [], r"rows\.parquet row 1: the row is 50\.0 MB, over the 4\.0 MB row cap"),
        # ... and among small rows (the group's share is under the cap): measured in Arrow before to_pylist
        "parquet_row": (lambda p: _write(p, [GOOD] * 20 + [_with_text(BIG)]), ".parquet", [],
                        r"rows\.parquet row 20: the row is 50\.0 MB, over the 4\.0 MB row cap"),
        # the row cap raised, the field cap holds
        "jsonl_field": (lambda p: _write(p, [_with_text("y" * (2 * MB))]), ".jsonl", ["--max-row-mb", "8"],
                        r"rows\.jsonl line 1: `conversations\[0\]\.value` is 2\.0 MB, over the 1\.0 MB field cap "
                        r"\(--max-field-mb"),
        "parquet_field": (lambda p: _write(p, [_with_text("é" * MB)]), ".parquet", ["--max-row-mb", "8"],
                          r"rows\.parquet row 0: `conversations\[0\]\.value` is 2\.0 MB, over the 1\.0 MB field"),
        # numbers a reward reads, and text no tokenizer takes
        "nan": (lambda p: p.write_text(json.dumps({**GOOD, "reward": float("nan")}) + "\n"), ".jsonl", [],
                r"rows\.jsonl line 1: `reward` is nan, not a finite number"),
        "inf": (lambda p: p.write_text(json.dumps(GOOD)[:-1] + ', "reward": 1e999}\n'), ".jsonl", [],
                r"rows\.jsonl line 1: `reward` is inf, not a finite number"),
        "nan_json": (lambda p: p.write_text(json.dumps([GOOD, {**GOOD, "score": float("-inf")}])), ".json", [],
                     r"rows\.json row 1: `score` is -inf, not a finite number"),
        "nan_parquet": (lambda p: _write(p, [{**GOOD, "reward": 1.0}, {**GOOD, "reward": float("nan")}]), ".parquet",
                        [], r"rows\.parquet row 1: `reward` is nan, not a finite number"),
        "nan_nested": (lambda p: p.write_text(json.dumps({**GOOD, "extra_info": {"w": [1, float("inf")]}}) + "\n"),
                       ".jsonl", [], r"line 1: `extra_info\.w\[1\]` is inf"),
        "int_400": (lambda p: p.write_text(json.dumps(GOOD)[:-1] + ', "reward": 1' + "0" * 400 + "}\n"), ".jsonl",
                    [], r"rows\.jsonl line 1: `reward` is an integer of 401 digits, too large for a number"),
        "int_5000": (lambda p: p.write_text(json.dumps(GOOD)[:-1] + ', "reward": ' + "9" * 5000 + "}\n"), ".jsonl",
                     [], r"rows\.jsonl line 1: cannot read a number"),
        "surrogate": (lambda p: p.write_text(json.dumps(_with_text("a\ud800b"))), ".jsonl", [],
                      r"rows\.jsonl line 1: `conversations\[0\]\.value` holds a lone surrogate "
                      r"\(\\ud800 at character 1\)"),
        "surrogate_key": (lambda p: p.write_text(json.dumps([{**GOOD, "extra_info": {"\udc00": 1}}])), ".json", [],
                          r"rows\.json row 0: `extra_info` holds a lone surrogate"),
        "surrogate_text_conv": (lambda p: p.write_text(json.dumps(
            {**GOOD, "conversations": json.dumps([{"from": "human", "value": "\udfff"}])}) + "\n"), ".jsonl", [],
            r"row 0: the JSON text of `conversations`: `\[0\]\.value` holds a lone surrogate"),
        "deep": (lambda p: p.write_text(json.dumps({**GOOD, "prompt": json.loads("[" * 70 + "]" * 70)}) + "\n"),
                 ".jsonl", [], r"rows\.jsonl line 1: `prompt` nested too deeply \(at most 64 levels"),
        "bad_cap": (lambda p: _write(p, [GOOD]), ".jsonl", ["--max-row-mb", "0"],
                    r"--max-row-mb must be a number of megabytes above 0"),
        "nan_cap": (lambda p: _write(p, [GOOD]), ".jsonl", ["--max-field-mb", "nan"],
                    r"--max-field-mb must be a number of megabytes above 0"),
    }
    make, suffix, opts, pattern = cases[kind]
    path = d / f"rows{suffix}"
    make(path)
    return path, opts, pattern


KINDS = ["jsonl_row", "json_row", "parquet_group", "parquet_row", "jsonl_field", "parquet_field", "nan", "inf",
         "nan_json", "nan_parquet", "nan_nested", "int_400", "int_5000", "surrogate", "surrogate_key",
         "surrogate_text_conv", "deep", "bad_cap", "nan_cap"]


@pytest.mark.parametrize("kind", KINDS)
def test_a_row_over_a_cap_or_holding_what_no_column_holds_is_one_line(kind, root, tiny, capsys, tmp_path):
    path, opts, pattern = _case(kind, tmp_path)
    line = _refused(["import", "agentgym", str(path), "--tokenizer", str(tiny), *opts], root, capsys)
    assert re.search(pattern, line), line


def test_raised_caps_let_a_big_row_in(root, tiny, capsys, tmp_path):
    from trajlake.cli import main

    path = _write(tmp_path / "big.jsonl", [_with_text("ab " * (MB * 2 // 5))])  # a 1.2 MB message
    assert main(["--lake", str(tmp_path / "lake"), "import", "agentgym", str(path), "--tokenizer", str(tiny),
                 "--max-field-mb", "1.5"]) == 0, capsys.readouterr().err
    assert "imported 1 episodes" in capsys.readouterr().out


def test_the_defaults_take_every_real_agentgym_file_and_the_help_says_them():
    """The real files (../shared/data/agentgym) are far under the caps: their largest row is 49 KB."""
    from tests.conftest import SHARED
    from trajlake.cli import data
    from trajlake.interop.importers import read_records

    assert f"default {DEFAULT_FIELD_MB})" in data.MAX_FIELD_HELP and f"default {DEFAULT_ROW_MB})" in data.MAX_ROW_HELP
    files = sorted((SHARED / "data" / "agentgym").glob("*/*.parquet"))
    if not files:
        pytest.skip("no AgentGym data")
    tight = Limits(max_field_bytes=64 << 10, max_row_bytes=256 << 10)  # 16x under the defaults, still enough
    assert sum(len(read_records(f, limits=tight)) for f in files) > 1000


# ---- import dataset: the same caps ------------------------------------------------------------------------
def _dataset(d: Path, **over) -> Path:
    """A one-episode parquet dataset folder (the columns `import dataset` needs)."""
    from trajlake.interop.hf_dataset import EPISODE_FIELDS

    row = dict.fromkeys(EPISODE_FIELDS)
    row.update(episode_id="e1", run_id="r1", status="ok", env_reward=1.0, run_kind="collect", run_config="{}",
               turns=[{"turn": 0, "observation": "o", "action_text": "a", "step_reward": 0.5, "info": "{}"}])
    row.update(over)
    d.mkdir()
    pq.write_table(pa.Table.from_pylist([row]), d / "episodes.parquet")
    return d


@pytest.mark.parametrize("over, opts, pattern", [
    ({"env_reward": float("nan")}, [], r"episodes\.parquet row 0: `env_reward` is nan, not a finite number"),
    ({"turns": [{"turn": 0, "step_reward": float("inf")}]}, [], r"row 0: `turns\[0\]\.step_reward` is inf"),
    ({"error": "w" * (3 * MB)}, ["--max-row-mb", "2"], r"episodes\.parquet row 0: the row is 3\.0 MB, over the 2\.0"),
    ({"error": "w" * (2 * MB)}, [], r"row 0: `error` is 2\.0 MB, over the 1\.0 MB field cap"),
])
def test_import_dataset_holds_rows_to_the_same_caps(over, opts, pattern, root, capsys, tmp_path):
    folder = _dataset(tmp_path / "ds", **over)
    line = _refused(["import", "dataset", str(folder), *opts], root, capsys)
    assert re.search(pattern, line), line


# ---- peak memory of a refused 50 MB row: about the cap, not the row -----------------------------------------
PEAK = """
import resource, subprocess, sys
r = subprocess.run([sys.executable, "-m", "trajlake", *sys.argv[1:]], capture_output=True, text=True)
sys.stderr.write(r.stderr)
print(r.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)  # KiB, of that one child
"""


@pytest.mark.slow  # a CLI process each (about 10 s: the tokenizer's imports)
@pytest.mark.parametrize("suffix, row", [(".jsonl", "line 2"), (".parquet", "row 20")])
def test_a_50mb_message_is_refused_in_under_1gb(suffix, row, tiny, tmp_path):
    """Unbounded, this import grew past 6 GB and ran until killed; now the refusal's peak is the process's own
    (torch and the tokenizer, about half a gigabyte) plus a few copies of the row cap (in parquet, the 50 MB
    value is among 20 small rows, so Arrow reads it and measures it before it becomes a Python string)."""
    path = _write(tmp_path / f"big{suffix}", [GOOD] * (20 if suffix == ".parquet" else 1) + [_with_text(BIG)])
    lake = tmp_path / "lake"
    out = subprocess.run([sys.executable, "-c", PEAK, "--lake", str(lake), "import", "agentgym", str(path),
                          "--tokenizer", str(tiny)], capture_output=True, text=True, timeout=300)
    code, peak_kib = map(int, out.stdout.split())
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert code == 1 and len(lines) == 1 and f"{row}: the row is" in lines[0] and "4.0 MB row cap" in lines[0], out
    assert peak_kib < 1 << 20, f"peak RSS {peak_kib / 1024:.0f} MiB"
    assert not lake.exists() or not any((lake / "data").rglob("*.parquet"))


# ---- the JSON list scanner: exactly json.loads's elements, whatever the block size --------------------------
def _value(rnd: random.Random, depth: int = 0):
    r = rnd.random()
    if depth > 3 or r < 0.3:
        return rnd.choice([1, -2.5, None, True, "a,b]}", 'q"uo\\te\\', "\\", "é😀[", "", "\n", "\\\""])
    if r < 0.6:
        return [_value(rnd, depth + 1) for _ in range(rnd.randint(0, 3))]
    return {rnd.choice(["k", "k]", 'k"', "é{"]): _value(rnd, depth + 1) for _ in range(rnd.randint(0, 3))}


def test_the_scanner_splits_exactly_the_lists_json_reads(monkeypatch):
    rnd = random.Random(7)
    for _ in range(600):
        value = [_value(rnd) for _ in range(rnd.randint(0, 5))]
        text = json.dumps(value, indent=rnd.choice([None, 1]), ensure_ascii=rnd.random() < 0.5).encode()
        monkeypatch.setattr(json_stream, "BLOCK", rnd.choice([1, 2, 3, 7, 64, 1 << 20]))  # elements across blocks
        assert [json.loads(e) for e in json_list_elements(io.BytesIO(text), 1 << 20)] == value, text


@pytest.mark.parametrize("text, message", [
    (b"", "must hold a list of objects, not nothing"),
    (b'{"a": 1}', "must hold a list of objects, not an object"),
    (b"[1", "line 1 column 2: the file ends before its list is closed"),
    (b'[{"conversations": [}', "line 1 column 21: Expecting value"),
    (b"[1]\n\n]", "line 3 column 1: extra data after the list"),
    (b"[}", "a `}` closes nothing"),
    (b'["abc\\"]', "Unterminated string"),
])
@pytest.mark.parametrize("block", [1, 1 << 20])
def test_the_scanner_refuses_what_is_not_a_list(text, message, block, monkeypatch):
    monkeypatch.setattr(json_stream, "BLOCK", block)
    with pytest.raises(JSONListError, match=message):
        list(json_list_elements(io.BytesIO(text), 100))


def test_the_scanner_stops_reading_at_the_cap(monkeypatch):
    """An element over the cap is refused once the cap is passed: the rest of it is never read."""
    monkeypatch.setattr(json_stream, "BLOCK", 16)
    f = io.BytesIO(b'[1, "' + b"x" * 10_000 + b'"]')
    with pytest.raises(JSONListError) as e:
        list(json_list_elements(f, 100))
    assert e.value.row == 1 and 100 < e.value.size <= 116 and f.tell() < 200


def test_empty_and_trailing_comma_elements_are_refused(tmp_path):
    from trajlake.interop.importers import read_records

    for text, pattern in (("[]", None), ('[{"a": 1},]', r"line 1 column 11 \(row 1\): Expecting value"),
                          ('[{"a": 1},, {"b": 2}]', r"line 1 column 11 \(row 1\): Expecting value"),
                          ("[1]", "row 0: expected an object, got int")):
        path = tmp_path / "x.json"
        path.write_text(text)
        if pattern is None:
            assert read_records(path) == []
        else:
            with pytest.raises(TrajectoryImportError, match=pattern):
                read_records(path)
