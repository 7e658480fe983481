"""Path tricks for every option that names a file or folder, generated: outputs onto the lake (its catalog
file, a symlink to it, a hard link to it or to a data file, its data folder, `../` back into it; every output,
a model's folder included, knows the lake --lake names), outputs onto /dev/null, a folder or under a file;
inputs that are /dev/null, a folder, the binary catalog, missing, or too long. Each case asserts what
tests/bad_inputs_common.check_case does, and that nothing is written outside the folder it may write into.
Ids that come from data (episode ids, envs holding `../`) must not climb out of the viewer's output folder.
"""

from __future__ import annotations

import json
import os

import pytest

from tests import bad_inputs_common as common
from tests.bad_inputs_common import case, check_case, disk_state, params

setting = common.setting  # the module's lake and files (a fixture)

L = ("--lake", "{lake}")

#: outputs: (name, argv before the path, argv after it, the folder-or-file it writes)
OUTPUTS = [
    ("sql -o", [*L, "sql", "SELECT 1", "-f", "csv", "-o"], []),
    ("export --query", [*L, "export"], ["--query", "SELECT 1"]),
    ("export --dataset", [*L, "export"], ["--dataset"]),
    ("view --out", [*L, "view", "--out"], []),
    ("report --out", [*L, "report", "--out"], []),
    ("model tiny --out", [*L, "model", "tiny", "--out"], []),
]
#: where an output must never go: the lake (refused naming it) or somewhere that is not a writable file
ONTO_THE_LAKE = [
    ("catalog", "{catalog}"),
    ("symlink to the catalog", "{tmp}/link-to-catalog"),
    ("in the data folder", "{data}/x.parquet"),
    ("symlink into the data folder", "{tmp}/link-to-data/x.parquet"),
    ("../ into the data folder", "{out}/../link-to-data/x.parquet"),
    ("hard link to the catalog", "{tmp}/hardlink-to-catalog"),
    ("hard link to a data file", "{tmp}/hardlink-to-data.parquet"),
]
#: (name, path, exit code, text) per output command where the answer differs between commands: None: any
#: one line (the command's own words for "not a writable file")
NOT_WRITABLE = [
    ("under a file", "{file}/x", None),
    ("an existing file as a folder", "{file}", None),
]


def _output_cases() -> list:
    out = []
    for name, before, after in OUTPUTS:
        for trick, path in ONTO_THE_LAKE:
            text = "under another name" if trick.startswith("hard link") else "inside the lake"
            out.append(case([*before, path, *after], 1, text, id=f"{name} onto the lake: {trick}"))
        for trick, path, text in NOT_WRITABLE:
            if name == "sql -o" and trick == "an existing file as a folder":
                continue  # a file is what sql -o writes: overwriting the user's own file is asked for
            if name == "export --query" and trick == "an existing file as a folder":
                continue
            out.append(case([*before, path, *after], 1, text or "", id=f"{name} {trick}"))
    return out


#: inputs: (name, argv with {path} where the path goes)
INPUTS = [
    ("sql --file", [*L, "sql", "--file", "{path}"]),
    ("rewards --spec", [*L, "rewards", "--spec", "{path}"]),
    ("rewards diff spec", [*L, "rewards", "diff", "{spec}", "{path}"]),
    ("evaluate --spec", [*L, "evaluate", "--env", "doors", "--policy", "scripted:doors", "--tokenizer", "{tiny}",
                         "--spec", "{path}"]),
    ("train --config", [*L, "train", "--config", "{path}"]),
    ("import agentgym file", [*L, "import", "agentgym", "{path}", "--tokenizer", "{tiny}"]),
    ("import agentgym --tokenizer", [*L, "import", "agentgym", "{jsonl}", "--tokenizer", "{path}"]),
    ("import dataset", [*L, "import", "dataset", "{path}"]),
    ("collect --tokenizer", [*L, "collect", "--env", "doors", "--policy", "scripted:doors", "--tokenizer",
                             "{path}"]),
    ("collect hf:", [*L, "collect", "--env", "doors", "--policy", "hf:{path}"]),
]
BAD_INPUTS = [
    ("missing", "{tmp}/nosuch"),
    ("/dev/null", "/dev/null"),
    ("a folder", "{out}"),
    ("the catalog", "{catalog}"),
    ("a symlink to the catalog", "{tmp}/link-to-catalog"),
    ("under a file", "{file}/x"),
    ("too long", "{tmp}/" + "n" * 300),
    ("unicode, missing", "{tmp}/ü名.toml"),
    ("html, missing", "{tmp}/<script>alert(1)<"),
]


def _input_cases() -> list:
    out = []
    for name, argv in INPUTS:
        for trick, path in BAD_INPUTS:
            if name == "import agentgym file" and trick == "a folder":
                continue  # a folder stands for its files; {out} may hold the other cases' outputs
            out.append(case([a.replace("{path}", path) for a in argv], 1, "", id=f"{name}: {trick}"))
    return out


OK_OUTPUTS = [
    case([*L, "sql", "SELECT 1", "-o", "/dev/null"], 0, id="sql -o /dev/null: fine, nothing written"),
    case([*L, "sql", "SELECT 1 AS x", "-f", "csv", "-o", "{out}/ü名 <b>.csv"], 0, writes="out",
         id="sql -o a unicode and html name: fine, inside out"),
    case([*L, "sql", "SELECT 1 AS x", "-f", "csv", "-o", "{out}/../out/y.csv"], 0, writes="out",
         id="sql -o with ../ staying inside out: fine"),
    case([*L, "sql", "SELECT 1 AS x", "-f", "csv", "-o", "{out}/nosuch/y.csv"], 1, "cannot write",
         id="sql -o into a missing folder"),
]

CASES = _output_cases() + _input_cases() + OK_OUTPUTS


def test_there_are_at_least_100_path_cases():
    assert len(CASES) >= 100


@pytest.mark.parametrize("c", params(CASES, catalog_every=4, fast_every=2))
def test_path_trick(c, setting, capsys, tmp_path):
    check_case(c, setting, capsys, tmp_path)


def test_ids_from_data_stay_inside_the_viewer_folder(tiny, tmp_path, capsys):
    """Imported ids holding `../`, separators, quotes and script become file names inside `view --out`'s
    folder, and the pages are written there only."""
    from trajlake.cli import main

    rows = []
    for i, item in enumerate(["../../escaped_1", "a/b/../../../c_2", "x'><script>alert(4)</script>_3", "..", "%2e%2e"]):
        rows.append({"item_id": item, "data_source": f"../env{i}", "conversations": [
            {"from": "human", "value": f"<img src=x onerror=alert({i})>"},
            {"from": "gpt", "value": "Action: go", "loss": True}]})
    src = tmp_path / "in"
    src.mkdir()
    (src / "rows.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    lake = str(tmp_path / "lake")
    assert main(["--lake", lake, "import", "agentgym", str(src / "rows.jsonl"), "--tokenizer", str(tiny)]) == 0
    before = {p: v for p, v in disk_state(tmp_path).items() if not p.startswith("site")}
    assert main(["--lake", lake, "view", "--out", str(tmp_path / "site")]) == 0, capsys.readouterr().err
    after = {p: v for p, v in disk_state(tmp_path).items() if not p.startswith("site")}
    assert after == before, sorted(set(after) ^ set(before))
    for folder, _, files in os.walk(tmp_path / "site"):
        for name in files:
            real = os.path.realpath(os.path.join(folder, name))
            assert real.startswith(str((tmp_path / "site").resolve()) + os.sep), real
