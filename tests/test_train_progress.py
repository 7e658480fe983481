"""The train progress line (train.progress)."""

from __future__ import annotations


def test_train_progress_prints_a_line_per_update_off_a_terminal(capsys):
    """In a log file a live bar shows nothing until the end: there each update is one plain line."""
    from rich.console import Console

    from trajlake.train.progress import TrainProgress

    off_a_terminal = Console(stderr=True, force_terminal=False)
    with TrainProgress(5, enabled=True, run_id="r1", every=2, console=off_a_terminal) as bar:
        for step in range(1, 6):
            bar.update(step, {"loss": 0.5 / step, "reward_mean": 0.1 * step})
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("train r1 ")]
    assert [line.split()[2] for line in lines] == ["2/5", "4/5", "5/5"]  # every 2nd update, and the last
    assert "reward 0.2" in lines[0] and "loss 0.25" in lines[0]
    with TrainProgress(5, enabled=False, run_id="r2", console=Console(force_terminal=False)) as bar:
        bar.update(1, {"loss": 1.0})
    assert "train r2" not in capsys.readouterr().err
