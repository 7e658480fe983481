"""The commands of the README and of the docs site, tested.

The pages are read in the site's order: README.md, then the pages of mkdocs.yml's nav, then any page of docs/
the nav leaves out. Every fenced block is handled by its kind (HANDLING): the `bash` blocks run as written,
in that order, in one fresh folder (with the repository's configs, specs and docs beside it), a command an
earlier page already ran running once; the `python` blocks run after them as one script; the `sh` blocks are
commands the tests cannot run offline, each for a reason NOT_RUN names, and are checked against the CLI's
own help, the Makefile and the scripts they call; a `shell` block (a local Ray cluster) runs as one script in a
process namespace of its own (tests/test_docs_cluster.py). Running the blocks is slow (a couple of minutes: it trains
for real), so `make test-slow` and CI run it; the checks of the `sh` blocks are fast.
"""

from __future__ import annotations

import functools
import os
import re
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tests.docs_pages import ROOT, blocks, commands

#: what the tests do with each kind of fenced block; a block of any other kind fails the test
HANDLING = {
    "bash": "run as written, in the site's order, in one fresh folder (slow tier)",
    "python": "run after the bash blocks, as one script in that folder (slow tier)",
    "sh": "not run (NOT_RUN says why, command by command); checked against the CLI's help, the Makefile and the "
          "scripts it names",
    "shell": "run as written, as one script in a process namespace of its own (a local Ray cluster: "
             "tests/test_docs_cluster.py, slow tier)",
    "text": "output or a synopsis: not a command",
    "toml": "a config or spec shown: parsed",
}

#: why an `sh` command is not run by the tests: (pattern searched in the command, reason); the first match names it
NOT_RUN: tuple[tuple[str, str], ...] = (
    (r"^make ", "a make target: it sets up .venv and runs for minutes to hours (make test runs this very suite)"),
    (r"^source ", "changes the calling shell; the tests call .venv's python directly"),
    (r"RAY_ADDRESS=", "needs a Ray cluster of several machines (docs/train.md's `shell` block runs the same on one)"),
    (r"postgres:", "needs a PostgreSQL server (the store tests run against one where $TRAJLAKE_TEST_PG answers)"),
    (r"--env-url|^textcraft ", "needs AgentGym's env server running (tests/test_agentgym_textcraft.py starts one)"),
    (r"vllm:", "needs vLLM (make test-vllm plays it, in .venv-vllm)"),
    (r"deepspeed ", "launches several DeepSpeed processes (tests/test_train_distributed.py runs them, slow tier)"),
    (r"bench/learning\.py", "trains for an hour or more on AgentGym's server"),
    (r"demo-grpo/", "reads the lake `make demo` builds"),
    (r"^trajlake import agentgym ", "reads AgentGym's trajectory files beside the checkout (../shared/data/agentgym; "
                                    "tests/test_import_agentgym.py imports them)"),
)

#: `trajlake` commands whose first argument names a subcommand
GROUPS = ("import", "model", "rewards", "lease")

BLOCKS = blocks()


def why_not_run(cmd: str) -> str | None:
    return next((reason for pattern, reason in NOT_RUN if re.search(pattern, cmd)), None)


def env() -> dict[str, str]:
    e = {k: v for k, v in os.environ.items() if k != "TRAJLAKE_LAKE"}
    e["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{e.get('PATH', '')}"
    e["DS_ACCELERATOR"] = "cpu"
    return e


def test_readme_has_the_blocks_this_test_expects():
    readme = [b for b in BLOCKS if b.page == "README.md"]
    sh = "\n".join(b.body for b in readme if b.kind == "sh")
    for target in ("demo", "test", "test-slow"):
        assert f"make {target}" in sh, f"README does not give `make {target}`"
    bash = "\n".join(b.body for b in readme if b.kind == "bash")
    for stage in ("collect", "sql", "rewards", "train", "evaluate"):
        assert f"trajlake {stage}" in bash, f"README's tour has no `trajlake {stage}` block"
    assert len({b.page for b in BLOCKS}) > 5, "the docs pages' blocks were not found"


def test_every_block_kind_is_handled():
    unknown = {(b.page, b.kind) for b in BLOCKS if b.kind not in HANDLING}
    assert not unknown, f"blocks of kinds the tests do not handle (add one to HANDLING or use another): {unknown}"


def test_every_sh_command_says_why_it_is_not_run():
    silent = [(b.page, cmd) for b in BLOCKS if b.kind == "sh" for cmd in commands(b.body) if not why_not_run(cmd)]
    assert not silent, f"sh commands the tests do not run, for no reason NOT_RUN gives (make them bash?): {silent}"


def test_toml_blocks_parse():
    for b in BLOCKS:
        if b.kind == "toml":
            tomllib.loads(b.body)


@functools.cache
def _help(sub: tuple[str, ...]) -> str:
    """`trajlake SUB --help`, in this process (a subprocess per command would cost seconds each)."""
    from typer.testing import CliRunner

    from trajlake.cli import app

    r = CliRunner().invoke(app, [*sub, "--help"], env={"COLUMNS": "200", "TERMINAL_WIDTH": "200"})
    assert r.exit_code == 0, f"trajlake {' '.join(sub)} --help failed: {r.output}"
    return r.output


def _check_sh_command(page: str, cmd: str, targets: set[str]) -> None:
    words = shlex.split(cmd.split(" #", 1)[0])
    while re.match(r"^[A-Z_]+=", words[0]):  # VAR=value prefixes
        words = words[1:]
    if words[0] == "make":
        for target in (w for w in words[1:] if not re.match(r"^[A-Z_]+=", w)):
            assert target in targets, f"{page} names make target {target!r}, not in the Makefile"
    elif words[0] == "trajlake":
        args = words[1:]
        while args and args[0].startswith("--"):  # --lake URI
            args = args[2:]
        sub = [args[0]] + ([args[1]] if args[0] in GROUPS and len(args) > 1 and not args[1].startswith("-") else [])
        text = _help(tuple(sub))
        for opt in (w for w in args if w.startswith("--")):
            assert opt in text, f"{page}: `trajlake {' '.join(sub)}` has no option {opt}"
    elif words[0].endswith("deepspeed"):
        assert "--module" in words and "trajlake.train" in words
        config = words[words.index("--config") + 1]
        assert (ROOT / config).is_file(), f"{page}: {config} does not exist"
    elif words[0].endswith("python"):
        script = ROOT / words[1]
        assert script.is_file(), f"{page}: {words[1]} does not exist"
        source = script.read_text()
        for opt in (w for w in words[2:] if w.startswith("--")):
            assert f'"{opt}"' in source, f"{page}: {words[1]} takes no option {opt}"


def test_sh_commands_name_real_targets_options_and_files():
    targets = set(re.findall(r"^([\w-]+):", (ROOT / "Makefile").read_text(), flags=re.M))
    for b in BLOCKS:
        if b.kind == "sh":
            for cmd in commands(b.body):
                _check_sh_command(b.page, cmd, targets)


@pytest.mark.slow
def test_readme_and_docs_blocks_run_as_written(tmp_path):
    for folder in ("train", "rewards", "docs"):
        (tmp_path / folder).symlink_to(ROOT / folder)
    ran: set[str] = set()
    for b in BLOCKS:
        if b.kind != "bash":
            continue
        for cmd in commands(b.body):
            if cmd in ran:  # the same step of the same tour, shown again on a later page
                continue
            ran.add(cmd)
            r = subprocess.run(["bash", "-c", cmd], cwd=tmp_path, env=env(), capture_output=True, text=True,
                               timeout=600)
            assert r.returncode == 0, f"{b.page}: command failed: {cmd}\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}"
    python_blocks = list(dict.fromkeys(b.body for b in BLOCKS if b.kind == "python"))
    r = subprocess.run([sys.executable, "-c", "\n\n".join(python_blocks)], cwd=tmp_path, env=env(),
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, f"the python blocks failed:\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}"
    assert "ScoreResult" in r.stdout or "short-and-right" in r.stdout
    assert (tmp_path / "reports" / "latest" / "index.html").is_file()
