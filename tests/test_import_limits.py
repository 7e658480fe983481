"""Bounded imports (interop/importers/limits.py, records.py): every imported row is measured before it is parsed
and held to the caps (row size, a text's size, nesting, finite numbers, no lone surrogate). Each refusal is one
`error: ` line naming the file, the row and the cap or the field, exit 1, and the lake's files as they were; a row
over the caps costs memory of the order of the cap, not of the row (a 50 MB message grew an import past 6 GB)."""

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
from trajlake.interop.importers import records
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
        # in a JSON list (ijson, yajl): -Infinity and NaN are not JSON, and a number past a float's range or an
        # integer past 64 bits is one yajl cannot read (a 5000-digit one crashed ijson's default mode)
        "nan_json": (lambda p: p.write_text(json.dumps([GOOD, {**GOOD, "score": float("-inf")}])), ".json", [],
                     r"rows\.json row 1: invalid JSON \(lexical error: malformed number"),
        "inf_json": (lambda p: p.write_text(json.dumps([GOOD])[:-2] + ', "reward": 1e999}]'), ".json", [],
                     r"rows\.json row 0: cannot read a number \(parse error: numeric \(floating point\) overflow"),
        "int_json": (lambda p: p.write_text(json.dumps([GOOD])[:-2] + ', "reward": ' + "9" * 5000 + "}]"), ".json", [],
                     r"rows\.json row 0: cannot read a number \(parse error: integer overflow"),
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
                          r"rows\.json row 0: a text holds a lone surrogate"),
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
         "nan_json", "inf_json", "int_json", "nan_parquet", "nan_nested", "int_400", "int_5000", "surrogate",
         "surrogate_key", "surrogate_text_conv", "deep", "bad_cap", "nan_cap"]


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
@pytest.mark.parametrize("suffix, row", [(".jsonl", "line 2"), (".json", "row 1"), (".parquet", "row 20")])
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


# ---- JSON list files: ijson's elements, one at a time -------------------------------------------------------
def _json_file(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def _value(rnd: random.Random, depth: int = 0):
    r = rnd.random()
    if depth > 3 or r < 0.3:
        return rnd.choice([1, -2.5, None, True, "a,b]}", 'q"uo\\te\\', "\\", "é😀[", "", "\n", "\\\""])
    if r < 0.6:
        return [_value(rnd, depth + 1) for _ in range(rnd.randint(0, 3))]
    return {rnd.choice(["k", "k]", 'k"', "é{"]): _value(rnd, depth + 1) for _ in range(rnd.randint(0, 3))}


def test_a_json_list_reads_exactly_the_elements_json_reads(monkeypatch, tmp_path):
    rnd = random.Random(7)
    for _ in range(300):
        value = [_value(rnd) for _ in range(rnd.randint(0, 5))]
        text = json.dumps(value, indent=rnd.choice([None, 1]), ensure_ascii=rnd.random() < 0.5).encode()
        monkeypatch.setattr(records, "BLOCK", rnd.choice([1, 2, 3, 7, 64, 1 << 20]))  # elements across reads
        path = _json_file(tmp_path / "x.json", text)
        assert [row for _, _, row in records._json_rows(path, Limits())] == value, text


@pytest.mark.parametrize("text, message", [
    (b"", "x.json: a JSON file must hold a list of objects, not nothing"),
    (b" \n", "x.json: a JSON file must hold a list of objects, not nothing"),
    (b'{"a": 1}', "x.json: a JSON file must hold a list of objects, not an object"),
    (b"hello", r"x.json: invalid JSON \(lexical error: invalid char in json text"),
    (b"[", r"x.json row 0: invalid JSON \(parse error: premature EOF\)"),
    (b'[{"conversations": [}', r"x.json row 0: invalid JSON \(parse error: unallowed token"),
    (b'[{"a": 1}]\n\n]', r"x.json row 1: invalid JSON \(parse error: trailing garbage"),
    (b"[}", "x.json row 0: invalid JSON"),
    (b'[{"a": "abc\\"}]', r"x.json row 0: invalid JSON \(parse error: premature EOF\)"),
    (b'[{"a": NaN}]', r"x.json row 0: invalid JSON \(lexical error: invalid char in json text"),
    (b'[{"a": "\xff"}]', r"x.json row 0: invalid JSON \(lexical error: invalid bytes in UTF8 string"),
    (b'[{"a": 1' + b"0" * 20 + b"}]", r"x.json row 0: cannot read a number \(parse error: integer overflow"),
    (b'[{"a": 1}, {"b": "\\udfff"}]', "x.json row 1: a text holds a lone surrogate"),
    (b'[{"a": ' + b"[" * 100 + b"]" * 100 + b"}]", r"x.json row 0: nested too deeply \(at most 64 levels"),
    (b'[{"a": 1},]', r"x.json row 1: invalid JSON \(parse error: unallowed token"),
    (b'[{"a": 1},, {"b": 2}]', r"x.json row 1: invalid JSON \(parse error: unallowed token"),
    (b"[1]", "x.json row 0: expected an object, got int"),
])
@pytest.mark.parametrize("block", [1, 1 << 20])
def test_what_is_not_a_json_list_of_objects_is_one_line(text, message, block, monkeypatch, tmp_path):
    from trajlake.interop.importers import read_records

    monkeypatch.setattr(records, "BLOCK", block)
    with pytest.raises(TrajectoryImportError, match=message) as e:
        read_records(_json_file(tmp_path / "x.json", text))
    assert "\n" not in str(e.value) and len(str(e.value)) < len(str(tmp_path)) + 200


def test_a_json_list_takes_a_byte_order_mark_and_no_lone_surrogate_comes_out(tmp_path):
    """yajl reads a lone high surrogate escape as `?` (ijson's pure-Python backend keeps it, and check_row
    refuses it): either way none reaches a tokenizer."""
    from trajlake.interop.importers import read_records

    assert read_records(_json_file(tmp_path / "x.json", b'\xef\xbb\xbf [{"a": 1}] ')) == [{"a": 1}]
    path = _json_file(tmp_path / "x.json", b'[{"a": "x\\ud800y"}]')
    try:
        rows = read_records(path)
    except TrajectoryImportError as e:
        assert "lone surrogate" in str(e)
    else:
        assert rows == [{"a": "x?y"}]


def test_a_json_element_over_the_cap_is_refused_once_the_cap_is_read(monkeypatch, tmp_path):
    """The rest of an element over the cap is never read: a 10 MB string with a 100-byte cap is refused, and the
    reads stop within a read block of the cap."""
    from trajlake.interop.importers import read_records

    path = _json_file(tmp_path / "x.json", b'[{"a": 1}, {"b": "' + b"x" * (10 * MB) + b'"}]')
    opened = []
    monkeypatch.setattr(records, "_open", lambda p: opened.append(open(p, "rb")) or opened[-1])
    with pytest.raises(TrajectoryImportError, match=r"x\.json row 1: the row is longer than the 100 bytes row cap"):
        read_records(path, limits=Limits(max_row_bytes=100))
    assert opened[0].closed
    monkeypatch.setattr(records, "BLOCK", 16)
    f = io.BytesIO(path.read_bytes())
    source = records._Counted(f, 1000)
    with pytest.raises(records._OverCap) as e:
        list(records._json_list(source, 64))
    assert 1000 < e.value.size <= 1016 and f.tell() < 1100


def test_a_row_just_over_the_cap_is_refused_and_one_at_the_cap_is_not(tmp_path):
    """The cap is measured in reads of at most a 64th of it, and an element is measured from the read where it
    began: one over the cap by more than a read block is refused, one under it never."""
    from trajlake.interop.importers import read_records

    cap = 64 << 10
    for size, refused in ((cap - 200, False), (cap + 2 * (cap // 64), True)):
        row = {"a": "y" * (size - len('{"a": ""}'))}
        path = _json_file(tmp_path / "x.json", json.dumps([{"b": 1}, row, {"c": 2}]).encode())
        limits = Limits(max_field_bytes=cap, max_row_bytes=cap)
        if refused:
            with pytest.raises(TrajectoryImportError, match="row 1: the row is longer than"):
                read_records(path, limits=limits)
        else:
            assert read_records(path, limits=limits)[1] == row
