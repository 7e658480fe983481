"""Property-based fuzzing of the command line (hypothesis): random values for every option of each command,
mixed with valid ones. Whatever the arguments, a command exits 0, 1 or 2, with no traceback and no "internal
error", and a refusal is exactly one `error: ` line; the lake and the files around it are unchanged (the
commands fuzzed here read, or are refused before they write: collect, evaluate and maintain get values that
always leave one option bad, so none of them plays or writes).
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests import bad_inputs_common as common
from tests.bad_inputs_common import case, check_case

setting = common.setting  # the module's lake and files (a fixture)

L = ["--lake", "{lake}"]

#: text that is hostile in every way the suites know (controls, unicode, braces kept literal, quotes, HTML)
TEXT = st.text(st.characters(codec="utf-8", exclude_characters="{}"), max_size=40)
NUMBER = st.one_of(st.integers(min_value=-(10**25), max_value=10**25).map(str),
                   st.floats(allow_nan=True, allow_infinity=True).map(repr),
                   st.sampled_from(["nan", "inf", "-inf", "", "1e400", "0x10", "½", "-0"]))
VALUE = st.one_of(TEXT, NUMBER)
#: in the slow tier (CI runs it), so that `make test` stays under 8 minutes
pytestmark = [pytest.mark.slow, pytest.mark.catalog_sample]  # on every catalog

#: 8 examples a test (x 7 tests x 3 catalogs: 392 s of the slow tier's work at 12, on a loaded machine); the
#: hostile suites (tests/test_bad_inputs*.py) hold the named cases, these the random mixtures
FUZZ = settings(max_examples=8, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

#: a bad value that each always-refused command carries, so no fuzzed combination plays, trains or writes
#: (last on the line: a repeated option's last value wins)
ALWAYS_BAD = {"collect": ["--tasks", "0"], "evaluate": ["--tasks", "0"], "maintain": ["--grace", "soon"],
              "view": ["--port", "-1"], "rewards diff": ["--top", "-1"]}
OPTIONS = {
    "collect": ["--tasks", "--samples", "--task-offset", "--seed", "--max-turns", "--temperature", "--top-p",
                "--env", "--policy", "--split", "--template", "--run-id", "--env-url", "--concurrency",
                "--max-new-tokens", "--difficulty"],
    "evaluate": ["--tasks", "--samples", "--k", "--seed", "--temperature", "--top-p", "--env", "--policy",
                 "--split", "--env-url", "--spec"],
    "maintain": ["--expire-older-than", "--grace"],
    "view": ["--snapshot", "--out"],
    "rewards diff": ["--top", "--snapshot"],
}
BASES = {
    "collect": [*L, "collect", "--env", "doors", "--policy", "scripted:doors", "--tokenizer", "{tiny}"],
    "evaluate": [*L, "evaluate", "--env", "doors", "--policy", "scripted:doors", "--tokenizer", "{tiny}"],
    "maintain": [*L, "maintain"],
    "view": [*L, "view"],
    "rewards diff": [*L, "rewards", "diff", "{spec}", "{spec}"],
}


@pytest.mark.parametrize("command", ["collect", "evaluate", "maintain", "view", "rewards diff"])
def test_fuzzed_options_are_refused_in_one_line(command, setting, capsys, tmp_path):
    """Random values for random options, with one always-bad value: refused, in one line, writing nothing."""
    @FUZZ
    @given(st.lists(st.tuples(st.sampled_from(OPTIONS[command]), VALUE), max_size=4))
    def run(pairs):
        argv = list(BASES[command]) + [x for pair in pairs for x in pair] + ALWAYS_BAD.get(command, [])
        check_case(case(argv, (1, 2)), setting, capsys, tmp_path)

    run()


@FUZZ
@given(snapshot=VALUE, fmt=st.one_of(st.sampled_from(["table", "csv", "json"]), TEXT))
def test_fuzzed_sql_options(setting, capsys, tmp_path, snapshot, fmt):
    """sql with a random snapshot and format: one line, or (a valid pair) the result; nothing written."""
    check_case(case([*L, "sql", "SELECT 1", "--snapshot", snapshot, "--format", fmt], (0, 1, 2)), setting, capsys,
               tmp_path)


@FUZZ
@given(sql=st.one_of(TEXT, st.sampled_from(["success", "1", "num_turns > 0", "episode_id LIKE '%'"])),
       prefix=st.sampled_from(["", "(SELECT count(*) FROM ducklake_cleanup_old_files('lake', cleanup_all => true))"
                                   " >= 0 OR "]))
def test_fuzzed_dataset_where_never_writes_the_lake(setting, capsys, tmp_path, sql, prefix):
    """export --dataset --where with random SQL (after a subquery that would delete files, half of the time):
    an expression exports into the output folder, anything else is one line; the lake never changes."""
    import shutil

    shutil.rmtree(f"{setting['out']}/fuzz-ds", ignore_errors=True)
    check_case(case([*L, "export", "{out}/fuzz-ds", "--dataset", "--where", prefix + sql], (0, 1), writes="out"),
               setting, capsys, tmp_path)
