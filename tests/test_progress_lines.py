"""Progress off a terminal (core/progress.py, and collect's, train's and the importer's on it): one plain,
complete line per update due on stderr, never a bar cut to 80 columns (`collect eval-doors-val-680c3ad467f1
━━━━━━ 100/1… success 5%  1,846 tok/s 0:00:…`)."""

from __future__ import annotations

import re

from rich.console import Console

from trajlake.collect.progress import CollectProgress
from trajlake.core.progress import StepProgress

OFF = dict(console=Console(stderr=True, force_terminal=False))


def _lines(capsys, prefix: str) -> list[str]:
    return [line for line in capsys.readouterr().err.splitlines() if line.startswith(prefix)]


def test_each_update_is_one_complete_line(capsys):
    with StepProgress("export", "a-run-id-longer-than-a-terminal-would-show-" * 2, 3, **OFF) as bar:
        for k in range(1, 4):
            bar.update(k, stats=f"[bold]pages[/bold] {k * 100:,}  [red]0 errors[/red]")
    lines = _lines(capsys, "export ")
    assert len(lines) == 3
    assert re.fullmatch(r"export (a-run-id-longer-than-a-terminal-would-show-){2} 3/3  pages 300  0 errors  \d+s",
                        lines[-1]), lines[-1]  # markup shown plain, nothing cut
    assert not any("━" in line or "…" in line for line in lines)


def test_lines_are_rate_limited_and_the_last_always_shows(capsys):
    with StepProgress("collect", "r", 100, interval=3600, **OFF) as bar:
        for k in range(1, 101):
            bar.update(advance=1, stats=f"success {k}%")
    assert [line.split("  ")[0:2] for line in _lines(capsys, "collect r ")] == [["collect r 100/100", "success 100%"]]
    with StepProgress("collect", "r", 100, interval=3600, **OFF) as bar:  # stopped early: where it got to
        for _ in range(37):
            bar.update(advance=1)
    assert [line.split("  ")[0] for line in _lines(capsys, "collect r ")] == ["collect r 37/100"]
    with StepProgress("train", "t", 10, every=4, done=2, **OFF) as bar:  # every 4th step (from a resume), the last
        for k in range(3, 11):
            bar.update(k)
    assert [line.split()[2] for line in _lines(capsys, "train t ")] == ["4/10", "8/10", "10/10"]
    with StepProgress("collect", "idle", 0, **OFF) as idle:  # nothing to do: no line
        assert idle.completed == 0
    with StepProgress("collect", "off", 5, enabled=False, **OFF) as bar:
        bar.update(5)
    assert capsys.readouterr().err == ""


def test_collect_progress_off_a_terminal(capsys):
    with CollectProgress(4, enabled=True, run_id="eval-doors-val-680c3ad467f1", interval=0, **OFF) as bar:
        bar.episode_done(True, 10)
        bar.episode_done(False, 10, error=True)
        bar.episode_done(False, 10)
        bar.episode_done(True, 10)
    lines = _lines(capsys, "collect eval-doors-val-680c3ad467f1 ")
    assert len(lines) == 4
    assert re.fullmatch(r"collect eval-doors-val-680c3ad467f1 4/4  success 67%  1 env errors  [\d,]+ tok/s  \d+s",
                        lines[-1]), lines[-1]


def test_a_warning_shows_among_the_lines(capsys):
    from trajlake.train.progress import TrainProgress

    with TrainProgress(2, enabled=True, run_id="r[1]", **OFF) as bar:
        bar.update(1, {"loss": 0.5})
        bar.warn("3 iterations in a row without a learning signal [every advantage 0]")
        bar.update(2, {"loss": 0.25})
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("train r[1] 1/2  loss 0.5")
    assert err[1] == "warning: train r[1]: 3 iterations in a row without a learning signal [every advantage 0]"
    assert err[2].startswith("train r[1] 2/2  loss 0.25")
