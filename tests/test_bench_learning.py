"""bench/learning.py: bad options stop it before any work; one tiny seed runs every stage (slow)."""

from __future__ import annotations

import pytest

from tests.conftest import load_bench


@pytest.fixture(scope="module")
def bench():
    return load_bench("learning")


def test_bad_options_stop_before_any_work(bench, capsys):
    assert bench.main(["--seeds", "0"]) == 1
    assert capsys.readouterr().err.strip() == "error: seeds must be >= 1, got 0"
    assert bench.main(["--iterations", "0"]) == 1
    assert capsys.readouterr().err.strip() == "error: demo: iterations must be >= 1, got 0"
    assert bench.main(["--expert-noise", "2"]) == 1
    assert "expert_noise must be between 0 and 1" in capsys.readouterr().err


@pytest.mark.slow
def test_one_tiny_seed_prints_the_plateau_and_rl(bench, tiny, capsys):
    argv = ["--seeds", "1", "--expert-noise", "0", "--demos", "8", "--sft-steps", "4", "--sft-every", "2",
            "--iterations", "1", "--tasks", "4", "--samples", "2", "--eval-tasks", "4", "--micro-batch", "8",
            "--kl-coef", "0.01", "--model", str(tiny)]
    assert bench.main(argv) == 0
    out = capsys.readouterr().out
    assert "seed 0: expert 1.00" in out and "mean gain of RL over the SFT plateau" in out
