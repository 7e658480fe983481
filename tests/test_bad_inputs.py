"""Every command against its bad inputs, table-driven: each case exits with the code it should (1 for a bad
value, 2 for a usage error), prints one line on stderr and no traceback, and leaves the lake as it was (the
same snapshots and row counts of every table), on every catalog backend (SQLite and PostgreSQL in the slow
suite). The shared setting and checks are in tests/bad_inputs_common.py; the other hostile suites are
tests/test_bad_inputs_{cli,paths,sql}.py and tests/test_fuzz_{cli,import}.py."""

from __future__ import annotations

import pytest

from tests import bad_inputs_common as common
from tests.bad_inputs_common import case, check_case, params

setting = common.setting  # the module's lake and files (a fixture)

#: (argv, exit code, text the one line contains); {lake} {tmp} {tiny} {spec} {bad_toml} {file} {jsonl} are filled in
CASES = [
    # the lake URI
    (["--lake", "", "tables"], 1, "empty lake URI"),
    (["--lake", "ftp://x/y", "tables"], 1, "unknown lake URI scheme 'ftp'"),
    (["--lake", "postgres:host=127.0.0.1", "tables"], 1, "postgres URI needs dbname="),
    (["--lake", "postgres:dbname", "tables"], 1, "is not key=value"),
    (["--lake", "{file}", "tables"], 1, "is a file; a DuckDB-file lake is a folder"),
    (["--lake", "sqlite:{tmp}", "tables"], 1, "sqlite: URI names the folder"),
    (["--lake", "sqlite:", "tables"], 1, "sqlite: URI needs a file path"),
    (["--lake", "{lake} data_path=", "tables"], 1, "data_path= needs a value"),
    (["--lake", "{tmp}/none", "snapshots"], 1, "no lake at"),
    # usage
    (["nosuch"], 2, "No such command 'nosuch'"),
    (["--lake", "{lake}", "export", "{tmp}/x.parquet"], 2, "give --query SQL (a parquet file) or --dataset"),
    (["--lake", "{lake}", "export", "{tmp}/x", "--dataset", "--query", "SELECT 1"], 2, "not both"),
    (["--lake", "{lake}", "export", "{tmp}/x.parquet", "--query", "SELECT 1", "--where", "success"], 2,
     "--where and --spec go with --dataset"),
    (["--lake", "{lake}", "collect", "--env", "doors"], 2, "Missing option '--policy'"),
    (["--lake", "{lake}", "collect", "--env", "doors", "--policy", "x", "--tasks", "many"], 2,
     "Invalid value for '--tasks'"),
    (["--lake", "{lake}", "sql", "SELECT 1", "-f", "xml"], 2, "Invalid value for '--format'"),
    (["--lake", "{lake}", "evaluate", "--env", "doors"], 2, "Missing option '--policy'"),
    (["--lake", "{lake}", "train"], 2, "Missing option '--config'"),
    # sql and export
    (["--lake", "{lake}", "sql", "DROP TABLE episodes"], 1, "DROP statements are refused"),
    (["--lake", "{lake}", "sql", "DELETE FROM episodes"], 1, "DELETE statements are refused"),
    (["--lake", "{lake}", "sql", "UPDATE episodes SET success = true"], 1, "UPDATE statements are refused"),
    (["--lake", "{lake}", "sql", "SELECT 1; DELETE FROM turns"], 1, "one statement at a time"),
    (["--lake", "{lake}", "sql", "SELECT nosuchcol FROM episodes"], 1, "nosuchcol"),
    (["--lake", "{lake}", "sql", "SELECT * FROM nosuchtable"], 1, "nosuchtable"),
    (["--lake", "{lake}", "sql", "SELEC 1"], 1, "syntax error"),
    (["--lake", "{lake}", "sql", "SELECT 1", "-s", "999"], 1, "snapshot 999 does not exist"),
    (["--lake", "{lake}", "sql", "SELECT 1", "--file", "{tmp}/none.sql"], 1, "give the SQL either as an argument"),
    (["--lake", "{lake}", "sql", "--file", "{tmp}/none.sql"], 1, "cannot read SQL file"),
    (["--lake", "{lake}", "sql", "SELECT 1", "-f", "parquet"], 1, "--format parquet needs --out PATH"),
    (["--lake", "{lake}", "export", "{tmp}/x.parquet", "--query", "DELETE FROM episodes"], 1,
     "DELETE statements are refused"),
    (["--lake", "{lake}", "export", "{tmp}/x.parquet", "--query", "SELECT 1", "-s", "999"], 1,
     "snapshot 999 does not exist"),
    # maintain
    (["--lake", "{lake}", "maintain", "--expire-older-than", "soon"], 1, "soon"),
    (["--lake", "{lake}", "maintain", "--grace", "1 fortnight"], 1, "fortnight"),
    # collect
    (["--lake", "{lake}", "collect", "--env", "nosuch", "--policy", "scripted", "--tokenizer", "{tiny}"], 1,
     "unknown env 'nosuch'"),
    (["--lake", "{lake}", "collect", "--env", "doors", "--policy", "gpt:4"], 1, "unknown policy spec 'gpt:4'"),
    (["--lake", "{lake}", "collect", "--env", "doors", "--policy", "hf:{tmp}/nomodel"], 1, "nomodel"),
    (["--lake", "{lake}", "collect", "--env", "doors", "--policy", "scripted:doors"], 1, "give tokenizer=PATH"),
    (["--lake", "{lake}", "collect", "--env", "doors", "--policy", "scripted:doors", "--tokenizer", "{tiny}",
      "--tasks", "0"], 1, "tasks"),
    (["--lake", "{lake}", "collect", "--env", "doors", "--policy", "scripted:doors", "--tokenizer", "{tiny}",
      "--samples", "0"], 1, "samples"),
    (["--lake", "{lake}", "collect", "--env", "doors", "--policy", "scripted:doors", "--tokenizer", "{tiny}",
      "--max-turns", "0"], 1, "max_turns"),
    (["--lake", "{lake}", "collect", "--env", "doors", "--policy", "scripted:doors", "--tokenizer", "{tiny}",
      "--difficulty", "99"], 1, "difficulty"),
    (["--lake", "{lake}", "collect", "--env", "doors", "--policy", "scripted:doors", "--tokenizer", "{tiny}",
      "--split", "holdout"], 1, "split"),
    (["--lake", "{lake}", "collect", "--env", "doors", "--policy", "hf:{tiny}", "--temperature", "-1"], 1,
     "temperature"),
    (["--lake", "{lake}", "collect", "--env", "doors", "--policy", "hf:{tiny}", "--top-p", "2"], 1, "top_p"),
    (["--lake", "{lake}", "collect", "--env", "doors", "--policy", "scripted:doors", "--tokenizer", "{tiny}",
      "--template", "yaml"], 1, "yaml"),
    (["--lake", "{lake}", "collect", "--env", "doors", "--policy", "scripted:doors?noise=2", "--tokenizer",
      "{tiny}"], 1, "noise must be a probability between 0 and 1"),
    (["--lake", "{lake}", "collect", "--env", "doors", "--policy", "scripted:maze", "--tokenizer", "{tiny}"], 1,
     "is the expert of env 'maze'"),
    (["--lake", "{lake}", "collect", "--env", "agentgym/textcraft", "--policy", "scripted", "--tokenizer", "{tiny}"],
     1, "plays an AgentGym server: give its URL (--env-url URL)"),
    (["--lake", "{lake}", "collect", "--env", "doors", "--policy", "scripted:doors", "--tokenizer", "{tiny}",
      "--concurrency", "0"], 1, "concurrency"),
    (["--lake", "{lake}", "collect", "--env", "doors", "--policy", "policy:nosuch", "--tokenizer", "{tiny}"], 1,
     "no policy 'nosuch' in the store"),
    (["--lake", "{lake}", "collect", "--env", "doors", "--policy", "run:nosuch"], 1,
     "train run 'nosuch' has no checkpoint"),
    # serve-env
    (["serve-env", "--env", "nosuch"], 1, "unknown env 'nosuch'"),
    (["serve-env", "--env", "doors", "--shape", "nosuch"], 1, "nosuch"),
    (["serve-env", "--env", "doors", "--port", "99999"], 1, "port must be 0..65535 (0: a free one), got 99999"),
    (["serve-env", "--env", "doors", "--host", "999.1.1.1", "--port", "0"], 1, "cannot serve on host '999.1.1.1'"),
    (["serve-env", "--env", "doors", "--host", "192.0.2.1", "--port", "0"], 1, "cannot serve on host '192.0.2.1'"),
    # rewards
    (["--lake", "{lake}", "rewards", "--spec", "{tmp}/none.toml"], 1, "none.toml"),
    (["--lake", "{lake}", "rewards", "--spec", "{bad_toml}"], 1, "bad.toml"),
    (["--lake", "{lake}", "rewards", "--where", "nosuchcol > 1"], 1, "nosuchcol"),
    (["--lake", "{lake}", "rewards", "--where", "true); DELETE FROM episodes; SELECT (1"], 1,
     "is not one SQL expression over episodes columns"),
    (["--lake", "{lake}", "rewards", "diff", "{spec}", "{spec}", "--where", "success AND"], 1,
     "is not one SQL expression over episodes columns"),
    (["--lake", "{lake}", "rewards", "diff", "{spec}", "{tmp}/none.toml"], 1, "none.toml"),
    # train
    (["--lake", "{lake}", "train", "--config", "{tmp}/none.toml"], 1, "none.toml"),
    (["--lake", "{lake}", "train", "--config", "{bad_toml}"], 1, "bad.toml"),
    (["--lake", "{lake}", "train", "--config", "{spec}"], 1, "unknown"),
    # evaluate
    (["--lake", "{lake}", "evaluate", "--env", "doors", "--policy", "gpt:4"], 1, "unknown policy spec 'gpt:4'"),
    (["--lake", "{lake}", "evaluate", "--env", "nosuch", "--policy", "hf:{tiny}"], 1, "unknown env 'nosuch'"),
    (["--lake", "{lake}", "evaluate", "--env", "doors", "--policy", "hf:{tiny}", "--tasks", "0"], 1, "tasks"),
    (["--lake", "{lake}", "evaluate", "--env", "doors", "--policy", "hf:{tiny}", "--policy", "hf:{tiny}"], 1,
     "a policy is given twice"),
    (["--lake", "{lake}", "evaluate", "--env", "doors", "--policy", "hf:{tiny}", "--samples", "2", "--greedy"], 1,
     "greedy"),
    (["--lake", "{lake}", "evaluate", "--env", "doors", "--policy", "hf:{tiny}", "--split", "holdout"], 1, "split"),
    # import and models
    (["--lake", "{lake}", "import", "agentgym", "{tmp}/none.parquet", "--tokenizer", "{tiny}"], 1, "none.parquet"),
    (["--lake", "{lake}", "import", "agentgym", "{file}", "--tokenizer", "{tiny}"], 1, "unsupported file type '.txt'"),
    (["--lake", "{lake}", "import", "agentgym", "{jsonl}", "--tokenizer", "{tmp}/notok"], 1, "notok"),
    (["model", "tiny", "--out", "{file}"], 1, "exists and is not a directory"),
    (["--lake", "{lake}", "report", "--out", "{file}"], 1, "file"),
]


def test_there_are_at_least_60_cases():
    assert len(CASES) >= 60


@pytest.mark.parametrize("c", params([case(*c) for c in CASES]))
def test_bad_input(c, setting, capsys, tmp_path):
    check_case(c, setting, capsys, tmp_path)
