"""bench/learning.py: bad options stop it before any work; one tiny seed runs every stage (slow)."""

from __future__ import annotations

import pytest

from tests.conftest import load_bench


@pytest.fixture(scope="module")
def bench():
    return load_bench("learning")


def test_bad_options_stop_before_any_work(bench, capsys):
    assert bench.main(["--seeds", "0"]) == 1
    assert capsys.readouterr().err.strip() == "error: seeds must be >= 1 and first-seed >= 0, got 0 and 0"
    assert bench.main(["--iterations", "0"]) == 1
    assert capsys.readouterr().err.strip() == "error: demo: the grpo stage's iterations must be >= 1, got 0"
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
    assert "GRPO by iteration" in out and "groups_with_outcome_difference" in out and "rounds" in out


def test_agentgym_options_are_checked_before_any_work(bench, capsys, tmp_path):
    assert bench.main(["--env", "agentgym/babyai", "--out", str(tmp_path)]) == 1
    assert capsys.readouterr().err.strip() == ("error: agentgym/babyai plays a server this bench cannot start: give "
                                               "--env-url URL of a running one")
    dead = ["--env", "agentgym/textcraft", "--env-url", "http://127.0.0.1:9", "--out", str(tmp_path)]
    assert bench.main([*dead, "--difficulty", "3"]) == 1
    assert capsys.readouterr().err.strip() == ("error: demo: agentgym/textcraft has no difficulty levels; leave "
                                               "difficulty unset")
    with pytest.raises(SystemExit):
        bench.main([*dead, "--train", "no-equals-sign"])
    assert "--train takes KEY=VALUE" in capsys.readouterr().err
    assert bench.train_override("horizon_start=2") == ("horizon_start", 2)
    assert bench.train_override("reward_spec=rewards/specs/x.toml") == ("reward_spec", "rewards/specs/x.toml")
    assert not list(tmp_path.iterdir())  # nothing played, nothing stored


@pytest.mark.slow
def test_one_tiny_seed_on_the_real_textcraft_server_is_held_out(bench, tiny, capsys, textcraft_url, tmp_path):
    argv = ["--env", "agentgym/textcraft", "--env-url", textcraft_url, "--seeds", "1", "--demos", "6",
            "--sft-steps", "2", "--sft-every", "1", "--iterations", "1", "--tasks", "2", "--samples", "2",
            "--eval-tasks", "2", "--max-turns", "3", "--micro-batch", "4", "--train", "horizon_start=2",
            "--model", str(tiny), "--out", str(tmp_path / "out")]
    assert bench.main(argv) == 0
    out = capsys.readouterr().out
    assert "seed 0: expert" in out and "test tasks found in a policy's training lineage: 0" in out
