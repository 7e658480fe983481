"""Every option of every command against every class of bad value, generated: (command, option) x (wrong type,
empty, huge, negative, NaN/inf, unicode, control characters, HTML, path tricks, over-long). Each case asserts
what tests/bad_inputs_common.check_case does: the exit code (2 where click refuses the type, 1 where trajlake
refuses the value), one `error: ` line naming the option, no traceback, the lake and the file system unchanged.

Each command line is otherwise valid, so the option under test is the only thing wrong with it; a class whose
value would be a valid input for an option (free text in --system-prompt) is not generated for it.
"""

from __future__ import annotations

import pytest

from tests import bad_inputs_common as common
from tests.bad_inputs_common import case, check_case, params

setting = common.setting  # the module's lake and files (a fixture)

L = ("--lake", "{lake}")
COLLECT = (*L, "collect", "--env", "doors", "--policy", "scripted:doors", "--tokenizer", "{tiny}")
EVALUATE = (*L, "evaluate", "--env", "doors", "--policy", "scripted:doors", "--tokenizer", "{tiny}")
SQL = (*L, "sql", "SELECT 1")
EXPORT = (*L, "export", "{out}/x.parquet", "--query", "SELECT 1")
REWARDS = (*L, "rewards")
DIFF = (*L, "rewards", "diff", "{spec}", "{spec}")
MAINTAIN = (*L, "maintain")
VIEW_OUT = (*L, "view", "--out", "{out}/site")
VIEW = (*L, "view")
SERVE = ("serve-env", "--env", "doors", "--port", "0")
TRAIN = (*L, "train", "--config", "{train_toml}")
REPLAY = (*L, "train", "--replay", "nosuch", "--step", "1")
REPLAY_ID = (*L, "train", "--step", "1")  # --replay is the option under test
REPORT = (*L, "report", "--out", "{out}/report")
IMPORT = (*L, "import", "agentgym", "{jsonl}", "--tokenizer", "{tiny}")
TINY = ("model", "tiny", "--out", "{out}/model")
SMOL = ("model", "smollm2", "--out", "{out}/smol")

TYPE = "Invalid value for '{opt}'"  # click's line for a value of the wrong type

#: the classes of bad value per kind of option: (class, value, exit code, text); text None: the option's own
#: text (`field`); "{opt}" is filled with the option
KINDS = {
    "int": [("word", "abc", 2, TYPE), ("fraction", "1.5", 2, TYPE), ("empty", "", 2, TYPE), ("nan", "nan", 2, TYPE),
            ("hex", "0x10", 2, TYPE), ("unicode", "½", 2, TYPE), ("huge", "99999999999999999999", 1, None),
            ("negative", "-1", 1, None), ("very-negative", "-99999999999999999999", 1, None)],
    "float": [("word", "abc", 2, TYPE), ("empty", "", 2, TYPE), ("unicode", "½", 2, TYPE), ("nan", "nan", 1, None),
              ("inf", "inf", 1, None), ("-inf", "-inf", 1, None), ("overflow", "1e400", 1, None),
              ("negative", "-1", 1, None)],
    "name": [("empty", "", 1, None), ("blank", "   ", 1, None), ("control", "\x1b[31mred", 1, None),
             ("newline", "a\nb", 1, None), ("unicode", "ü名", 1, None), ("html", "<script>alert(1)</script>", 1, None),
             ("path", "../../etc/passwd", 1, None), ("long", "a" * 5000, 1, None)],
    "url": [("empty", "", 1, "URL"), ("control", "http://a\x00b", 1, "control character"),
            ("scheme", "ftp://127.0.0.1/x", 1, "http(s) URL"), ("file", "file:///etc/passwd", 1, "http(s) URL"),
            ("script", "javascript:alert(1)", 1, "http(s) URL"), ("html", "<script>alert(1)</script>", 1, "http(s)"),
            ("ipv6", "http://[::1", 1, "not a valid URL"), ("port", "http://127.0.0.1:99999", 1, "not a valid URL"),
            ("noport", "http://127.0.0.1:x", 1, "not a valid URL"), ("nohost", "http://", 1, "http(s) URL")],
    "duration": [("empty", "", 1, "bad duration"), ("word", "soon", 1, "bad duration"),
                 ("negative", "-1h", 1, "bad duration"), ("nan", "nand", 1, "bad duration"),
                 ("inf", "infd", 1, "bad duration"), ("exponent", "1e3d", 1, "bad duration"),
                 ("huge", "99999999999999w", 1, "too long"), ("over-a-century", "36501d", 1, "too long"),
                 ("huge-float", "9" * 400 + "s", 1, "too long"), ("control", "1\x1bh", 1, "bad duration")],
    "path": [("empty", "", 2, "empty path"), ("blank", "  ", 2, "empty path"),
             ("nul", "a\x00b", 2, "control character"), ("newline", "a\nb", 2, "control character"),
             ("escape", "\x1b[2J", 2, "control character")],
}
#: the kinds of value ids are: the names kind, but every class is refused by ids.check_id
KINDS["id"] = KINDS["name"]

#: (command line, option, kind, text every refusal of this option contains, {class: (code, text)} overrides,
#: classes left out because they are valid for this option)
OPTIONS = [
    # collect: its own options and RolloutConfig's
    (COLLECT, "--tasks", "int", "tasks", {}, ()),
    (COLLECT, "--task-offset", "int", "task_offset", {}, ()),
    (COLLECT, "--samples", "int", "samples", {}, ()),
    (COLLECT, "--workers", "int", "workers", {}, ()),
    (COLLECT, "--seed", "int", "seed", {}, ()),
    (COLLECT, "--difficulty", "int", "difficulty", {}, ()),
    (COLLECT, "--max-turns", "int", "max_turns", {}, ()),
    (COLLECT, "--max-new-tokens", "int", "max_new_tokens", {}, ()),
    (COLLECT, "--max-context-tokens", "int", "max_context_tokens", {}, ()),
    (COLLECT, "--concurrency", "int", "concurrency", {}, ()),
    (COLLECT, "--replicas", "int", "replicas", {}, ()),
    (COLLECT, "--temperature", "float", "temperature", {}, ()),
    (COLLECT, "--top-p", "float", "top_p", {}, ()),
    (COLLECT, "--env", "name", "unknown env", {}, ()),
    (COLLECT, "--policy", "name", "policy", {}, ()),
    (COLLECT, "--template", "name", "unknown template", {}, ()),
    (COLLECT, "--split", "name", "split must be one of", {}, ()),
    (COLLECT, "--truncation", "name", "unknown truncation", {}, ()),
    (COLLECT, "--on-format-error", "name", "unknown on_format_error", {}, ()),
    (COLLECT, "--env-variant", "name", "--env-variant", {}, ()),
    (COLLECT, "--tokenizer", "name", "tokenizer", {"long": (1, "File name too long")}, ()),
    (COLLECT, "--run-id", "id", "--run-id", {}, ()),
    (COLLECT, "--env-url", "url", "", {}, ()),
    # evaluate
    (EVALUATE, "--tasks", "int", "tasks", {}, ()),
    (EVALUATE, "--samples", "int", "samples", {}, ()),
    (EVALUATE, "--seed", "int", "seed", {}, ()),
    (EVALUATE, "--k", "int", "pass@k", {}, ()),
    (EVALUATE, "--max-turns", "int", "max_turns", {}, ()),
    (EVALUATE, "--concurrency", "int", "concurrency", {}, ()),
    (EVALUATE, "--temperature", "float", "temperature", {}, ()),
    (EVALUATE, "--top-p", "float", "top_p", {}, ()),
    (EVALUATE, "--env", "name", "unknown env", {}, ()),
    (EVALUATE, "--policy", "name", "policy", {}, ()),
    (EVALUATE, "--split", "name", "split must be one of", {}, ()),
    (EVALUATE, "--template", "name", "unknown template", {}, ()),
    (EVALUATE, "--env-url", "url", "", {}, ()),
    (EVALUATE, "--spec", "path", "", {}, ()),
    # sql, export, rewards: snapshots, formats and counts
    (SQL, "--snapshot", "int", "snapshot", {}, ()),
    (SQL, "--format", "name", "Invalid value for '--format'", {c: (2, None) for c, *_ in KINDS["name"]}, ()),
    (SQL, "--out", "path", "", {}, ()),
    (SQL, "--file", "path", "", {}, ()),
    (EXPORT, "--snapshot", "int", "snapshot", {}, ()),
    (REWARDS, "--snapshot", "int", "snapshot", {}, ()),
    (REWARDS, "--spec", "path", "", {}, ()),
    (DIFF, "--top", "int", "--top", {}, ()),
    (DIFF, "--snapshot", "int", "snapshot", {}, ()),
    # maintain: durations
    (MAINTAIN, "--expire-older-than", "duration", "", {}, ()),
    (MAINTAIN, "--grace", "duration", "", {}, ()),
    # view and serve-env: ports, snapshots, names
    (VIEW, "--port", "int", "port must be 0..65535", {}, ()),
    (VIEW_OUT, "--snapshot", "int", "snapshot", {}, ()),
    (VIEW_OUT, "--spec", "name", "reward spec", {}, ()),
    (VIEW, "--out", "path", "", {}, ()),
    (SERVE, "--port", "int", "port must be 0..65535", {}, ()),
    (SERVE, "--env", "name", "unknown env", {}, ()),
    (SERVE, "--split", "name", "split", {}, ()),
    (SERVE, "--shape", "name", "", {}, ()),
    (SERVE, "--host", "name", "host", {}, ()),
    (SERVE, "--prefix", "name", "--prefix", {}, ("empty", "unicode", "html", "path", "long")),
    # train: its overrides and --replay
    (TRAIN, "--iterations", "int", "iterations", {}, ()),
    (TRAIN, "--train-snapshot", "int", "snapshot", {}, ()),
    (TRAIN, "--algo", "name", "algo", {}, ()),
    (TRAIN, "--run-id", "id", "run_id", {}, ()),
    (TRAIN, "--env-url", "url", "", {}, ()),
    (TRAIN, "--report-to", "name", "report_to", {}, ()),
    (TRAIN, "--config", "path", "", {}, ()),
    (REPLAY, "--atol", "float", "--atol", {}, ()),
    (REPLAY_ID, "--replay", "id", "--replay", {}, ()),
    (REPLAY, "--step", "int", "step", {"huge": (1, "no run 'nosuch'")}, ()),
    # report, import, model
    (REPORT, "--runs", "id", "--runs", {}, ()),
    (REPORT, "--out", "path", "", {}, ()),
    (IMPORT, "--run-id", "id", "--run-id", {}, ()),
    (IMPORT, "--env", "id", "--env", {}, ()),
    (IMPORT, "--split", "id", "--split", {}, ()),
    (IMPORT, "--tokenizer", "path", "", {}, ()),
    (TINY, "--seed", "int", "--seed", {}, ()),
    (TINY, "--out", "path", "", {}, ()),
    (SMOL, "--dtype", "name", "dtype must be", {}, ()),
]


def _generated() -> list:
    out = []
    for argv, opt, kind, field, overrides, skip in OPTIONS:
        for cls, value, code, text in KINDS[kind]:
            if cls in skip:
                continue
            code, override = overrides.get(cls, (code, None))
            text = override or (text.format(opt=opt) if text else None) or field
            if code == 2 and text == field and kind != "name":
                text = TYPE.format(opt=opt)
            out.append(case([*argv, opt, value], code, text, id=f"{argv[2] if argv[0] == '--lake' else argv[0]} "
                            f"{'diff ' if argv is DIFF else ''}{opt} {kind}:{cls}"))
    return out


GENERATED = _generated()

#: the run id arguments (`lease show ID`, `lease release ID`): every class of bad id, and a climb and 10k
#: characters, refused by ids.check_id in one line before the lake is opened (release wrote a snapshot)
BAD_IDS = [(cls, value) for cls, value, *_ in KINDS["id"]] + [("parents", "../.."), ("10k", "a" * 10_000)]
RUN_ID_ARGUMENTS = [case([*L, "lease", sub, value], 1, "run id", id=f"lease {sub} id:{cls}")
                    for sub in ("show", "release") for cls, value in BAD_IDS]

#: hand-written cases the matrix does not reach: the global --lake, commands without options, warnings
EXTRA = [
    case([*L[:1], "", "tables"], 1, "empty lake URI", id="--lake empty"),
    case(["--lake", "{tmp}/no\x1bsuch", "tables"], 1, "no lake at", id="--lake control"),
    case(["--lake", "{tmp}/ü名", "tables"], 1, "no lake at", id="--lake unicode"),
    case(["--lake", "{tmp}/<script>alert(1)</script>", "tables"], 1, "no lake at", id="--lake html"),
    case(["--lake", "{tmp}/" + "a" * 5000, "tables"], 1, "", id="--lake long"),
    case(["--lake", "{file}", "tables"], 1, "is a file", id="--lake a file"),
    case(["--lake", "sqlite:{file}", "tables"], 1, "", id="--lake sqlite: not a catalog"),
    case([*L, "tables", "extra"], 2, "unexpected extra argument", id="tables extra argument"),
    case([*L, "snapshots", "--all"], 2, "No such option", id="snapshots unknown option"),
    case(["envs", "--x"], 2, "No such option", id="envs unknown option"),
    case([*L, "sql", ""], 1, "no SQL statement given", id="sql empty"),
    case([*L, "sql", " \n\t "], 1, "no SQL statement given", id="sql blank"),
    case([*L, "sql", "-- only a comment"], 1, "no SQL statement given", id="sql comment only"),
    case([*L, "sql", "SELECT 'a\x1b[2Jb' AS x", "-f", "csv"], 0, id="sql control characters in a literal: fine"),
    case([*L, "sql", "SELECT 'ü名<script>' AS x"], 0, id="sql unicode and html in a literal: fine"),
    case([*L, "sql", "--file", "{catalog}"], 1, "cannot read SQL file", id="sql --file the catalog"),
    # files read whole grew until MemoryError (an internal error): read at most a cap, whatever the file is
    case([*L, "sql", "--file", "/dev/zero"], 1, "larger than 1 MiB", id="sql --file endless"),
    case([*L, "train", "--config", "/dev/zero"], 1, "larger than 1 MiB", id="train --config endless"),
    case([*L, "rewards", "--spec", "/dev/urandom"], 1, "larger than 1 MiB", id="rewards --spec endless"),
    case([*EVALUATE, "--spec", "/dev/zero"], 1, "larger than 1 MiB", id="evaluate --spec endless"),
    case([*L, "train", "--config", "{tmp}"], 1, "it is a folder", id="train --config a folder"),
    # tomllib parses nesting recursively (RecursionError): refused as not a config or spec
    case([*L, "train", "--config", "{deep_toml}"], 1, "nest too deep", id="train --config nested deep"),
    case([*L, "rewards", "--spec", "{deep_toml}"], 1, "nest too deep", id="rewards --spec nested deep"),
    case([*DIFF[:-1], "{deep_toml}"], 1, "nest too deep", id="rewards diff nested deep"),
    case([*L, "export", "{out}/x.parquet", "--query", ""], 1, "no SQL statement given", id="export empty query"),
    case([*L, "maintain", "--expire-older-than", "36501d", "--grace", "soon"], 1, "", id="maintain two bad"),
    case([*L, "collect", "--env", "doors", "--policy", "scripted:doors", "--tokenizer", "{tiny}", "--tasks",
          "100000", "--samples", "11"], 1, "tasks x samples must be at most 1_000_000", id="collect tasks x samples"),
    case([*L, "collect", "--env", "doors", "--policy", "scripted:doors", "--tokenizer", "{tiny}", "--tasks",
          "100000", "--task-offset", "999999"], 1, "task_offset + tasks", id="collect task_offset + tasks"),
    case([*L, "collect", "--env", "doors", "--env-url", "http://127.0.0.1:1", "--policy", "scripted:doors",
          "--tokenizer", "{tiny}"], 1, "is built in", id="collect --env-url with a built-in env"),
    case([*L, "evaluate", "--env", "doors", "--env-url", "http://127.0.0.1:1", "--policy", "scripted:doors",
          "--tokenizer", "{tiny}"], 1, "is built in", id="evaluate --env-url with a built-in env"),
    case([*L, "collect", "--env", "agentgym", "--env-url", "file:///etc/passwd", "--policy", "scripted",
          "--tokenizer", "{tiny}"], 1, "http(s) URL", id="collect agentgym file URL"),
    case([*L, "collect", "--env", "doors", "--policy", "scripted:doors", "--tokenizer", "{tiny}",
          "--max-context-tokens", "48"], 1, "must exceed max_new_tokens", id="collect context <= reply"),
    case([*L, "evaluate", "--env", "doors", "--policy", "scripted:doors", "--tokenizer", "{tiny}", "--samples",
          "1024", "--tasks", "100000"], 1, "tasks x samples", id="evaluate tasks x samples"),
    case([*L, "train", "--replay", "x"], 2, "--replay RUN_ID and --step N go together", id="train --replay alone"),
    case([*L, "train", "--step", "1"], 2, "--replay RUN_ID and --step N go together", id="train --step alone"),
    case(["serve-env", "--env", "doors", "--host", "", "--port", "0"], 1, "--host must not be empty",
         id="serve-env empty host (every interface)"),
    case([*L, "import", "agentgym", "--tokenizer", "{tiny}"], 2, "Missing argument", id="import no files"),
    case([*L, "rewards", "diff", "{spec}"], 2, "Missing argument", id="rewards diff one spec"),
    case([*L, "model", "nosuch"], 2, "No such command", id="model unknown"),
]


def test_there_are_at_least_250_generated_cases():
    assert len(GENERATED) + len(EXTRA) >= 250


@pytest.mark.parametrize("c", params(GENERATED + EXTRA, catalog_every=10, fast_every=3))
def test_bad_option(c, setting, capsys, tmp_path):
    check_case(c, setting, capsys, tmp_path)


@pytest.mark.parametrize("c", params(RUN_ID_ARGUMENTS, catalog_every=5))
def test_bad_run_id_argument(c, setting, capsys, tmp_path):
    check_case(c, setting, capsys, tmp_path)


@pytest.mark.slow  # 5 s: a whole evaluate run
def test_evaluate_on_the_train_split_warns(tiny, capsys, tmp_path):
    """Not an error: the evaluation runs, and one stderr line says its numbers are not held out."""
    from trajlake.cli import main

    argv = ["--lake", str(tmp_path / "lake"), "evaluate", "--env", "doors", "--policy", "scripted:doors",
            "--tokenizer", str(tiny), "--tasks", "1", "--max-turns", "1"]
    assert main([*argv, "--split", "train"]) == 0
    err = capsys.readouterr().err
    warnings = [line for line in err.splitlines() if line.startswith("warning: ")]
    assert len(warnings) == 1 and "not held out" in warnings[0], err
    assert "error" not in err
    assert main([*argv, "--split", "test"]) == 0
    assert "warning" not in capsys.readouterr().err
