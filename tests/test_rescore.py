"""`make rescore` (rescore.py): stored rollouts re-scored with a length penalty and retrained on without
playing; the new policy follows the new reward (shorter replies, success kept) where the same retrain under
the old spec does not. The whole workflow is slow (about 2 minutes); its config checks are not."""

from __future__ import annotations

import pytest

from trajlake.core.errors import TrajlakeError
from trajlake.recipes.rescore import RescoreConfig, main, run


@pytest.mark.parametrize("kw, message", [
    (dict(samples=1), "samples must be >= 2"),
    (dict(iterations=0), "iterations must be >= 1"),
    (dict(seeds=()), "at least one seed"),
    (dict(verbose=1.0), "verbose must be between 0 and 1"),
])
def test_config_errors_name_the_field(kw, message):
    with pytest.raises(TrajlakeError, match=message):
        RescoreConfig(**kw)


def test_cli_error_is_one_line(capsys, tmp_path):
    assert main(["--lake", str(tmp_path / "lake"), "--iterations", "0"]) == 1
    assert capsys.readouterr().err.strip() == "error: rescore: iterations must be >= 1, got 0"
    assert not (tmp_path / "lake").exists()


@pytest.mark.slow
def test_retrained_on_stored_rollouts_under_the_new_spec_replies_shorter_and_still_succeeds(tmp_path):
    cfg = RescoreConfig(lake=str(tmp_path / "lake"), models=tmp_path / "models", checkpoints=tmp_path / "ckpt",
                        eval_tasks=100, progress=False)
    res = {r["stage"]: r for r in run(cfg).to_dicts()}
    sft, concise, control = res["SFT (played the rollouts)"], res["concise"], res["default (control)"]
    assert concise["long_replies"] < sft["long_replies"] / 2, "the new policy follows the new reward"
    assert concise["reply_tokens"] < sft["reply_tokens"] - 5
    assert concise["success"] >= sft["success"] - 0.1, "success kept"
    # retraining alone (the old spec) shortens some too, by sharpening towards the more frequent short reply; by
    # how much depends on the library versions (one seed: 0.14 vs 0.10 long with transformers 5.24, where the
    # README's three seeds gave 0.21 vs 0.09), so the test holds the direction, the README the measured sizes
    assert control["long_replies"] > concise["long_replies"], "the spec made the difference"
    assert control["reply_tokens"] > concise["reply_tokens"], "the spec made the difference"
    # on the new reward both retrains beat the SFT policy; concise against the control is within the eval's noise
    # on one seed of 100 tasks (0.898 vs 0.902 with transformers 5.24: two successes), so it is not asserted
    assert concise["concise_reward"] > sft["concise_reward"] + 0.05
