"""The README's commands, tested: every `bash` block runs as written, in order, in a fresh folder (with the
repository's configs, specs and queries beside it); the `python` blocks run after them; the `sh` blocks
(which need a GPU, a cluster or another database) are checked against the CLI's own help and the Makefile.
Slow (a couple of minutes: it trains for real), so `make test-slow` and CI run it."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
BLOCKS = re.findall(r"^```(\w+)\n(.*?)^```", README, flags=re.S | re.M)


def commands(block: str) -> list[str]:
    """The block's commands: continuation lines joined, comments and blank lines dropped."""
    joined = re.sub(r"\\\n\s*", "", block)
    return [line for line in joined.splitlines() if line.strip() and not line.lstrip().startswith("#")]


def env() -> dict[str, str]:
    e = {k: v for k, v in os.environ.items() if k != "TRAJLAKE_LAKE"}
    e["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{e.get('PATH', '')}"
    e["DS_ACCELERATOR"] = "cpu"
    return e


def test_readme_has_the_blocks_this_test_expects():
    kinds = {k for k, _ in BLOCKS}
    assert {"bash", "python", "sh"} <= kinds
    assert any("make demo" in b for k, b in BLOCKS if k == "sh") and any("make test" in b for _, b in BLOCKS)


@pytest.mark.slow
def test_readme_blocks_run_as_written(tmp_path):
    for folder in ("train", "rewards", "docs"):
        (tmp_path / folder).symlink_to(ROOT / folder)
    for kind, block in BLOCKS:
        if kind != "bash":
            continue
        for cmd in commands(block):
            r = subprocess.run(["bash", "-c", cmd], cwd=tmp_path, env=env(), capture_output=True, text=True,
                               timeout=600)
            assert r.returncode == 0, f"README command failed: {cmd}\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}"
    script = "\n\n".join(b for k, b in BLOCKS if k == "python")
    r = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env(), capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, f"README python blocks failed:\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}"
    assert "ScoreResult" in r.stdout or "short-and-right" in r.stdout
    assert (tmp_path / "reports" / "latest" / "index.html").is_file()


def _help(sub: list[str]) -> str:
    r = subprocess.run([sys.executable, "-m", "trajlake", *sub, "--help"], capture_output=True, text=True,
                       env={**env(), "COLUMNS": "200"}, timeout=120)
    assert r.returncode == 0, f"trajlake {' '.join(sub)} --help failed: {r.stderr}"
    return r.stdout


def test_readme_sh_commands_name_real_targets_and_options():
    targets = set(re.findall(r"^([\w-]+):", (ROOT / "Makefile").read_text(), flags=re.M))
    for kind, block in BLOCKS:
        if kind != "sh":
            continue
        for cmd in commands(block):
            words = shlex.split(cmd.split("#", 1)[0])
            while re.match(r"^[A-Z_]+=", words[0]):  # VAR=value prefixes
                words = words[1:]
            if words[0] == "make":
                assert words[1] in targets, f"README names make target {words[1]!r}, not in the Makefile"
            elif words[0] == "trajlake":
                args = words[1:]
                globals_ = []
                while args and args[0].startswith("--"):  # --lake URI
                    globals_ += args[:2]
                    args = args[2:]
                sub = [args[0]] + ([args[1]] if args[0] in ("import", "model", "rewards") and len(args) > 1
                                   and not args[1].startswith("-") else [])
                text = _help(sub)
                for opt in (w for w in args if w.startswith("--")):
                    assert opt in text, f"README: `trajlake {' '.join(sub)}` has no option {opt}"
            elif words[0].endswith("deepspeed"):
                assert "--module" in words and "trajlake.train" in words
                config = words[words.index("--config") + 1]
                assert (ROOT / config).is_file(), config
