"""bench/train.py at a tiny size: each side runs its iterations and counts trained tokens the same way; the
TRL side only where TRL is installed (the bench extra)."""

from __future__ import annotations

import pytest

from tests.conftest import load_bench
from tests.helpers import tiny_model_dir

TINY = ["--prompts", "2", "--samples", "2", "--max-new-tokens", "4", "--micro-batch", "2", "--repeats", "1",
        "--threads", "0"]  # threads 0: leave this process's torch threads as they are


@pytest.fixture(scope="module")
def bench():
    return load_bench("train")


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return str(tiny_model_dir(tmp_path_factory))


@pytest.fixture(autouse=True)
def _threads():
    """accelerate sets torch's thread count when a process group exists (the train tests make one)."""
    import torch

    n = torch.get_num_threads()
    yield
    torch.set_num_threads(n)


def _check(result: dict, args) -> None:
    its = result["iterations"]
    assert len(its) == 1 + args.repeats
    for it in its:
        assert it["episodes"] == args.prompts * args.samples
        # the untrained model never says <|im_end|> within 4 tokens: every reply is 4 trained tokens
        assert 0 < it["tokens"] <= args.prompts * args.samples * args.max_new_tokens
        assert it["seconds"] > 0
    assert len(result["prompt_ids"]) == args.prompts


@pytest.mark.slow  # over 8 s on 2 cores: `make test` keeps its 8 minutes
def test_trajlake_side(bench, model, tmp_path):
    args = bench.parse_args(TINY)
    result = bench.run_trajlake(args, model, tmp_path)
    _check(result, args)
    assert all(it["loop_seconds"] <= it["seconds"] for it in result["iterations"][1:])
    row = bench.summarize(result)
    assert row["iterations"] == 1 and row["tokens_per_s"] > 0 and row["loop_tokens_per_s"] >= row["tokens_per_s"]


def test_trl_side_and_report(bench, model, tmp_path, capsys):
    pytest.importorskip("trl", reason="TRL is not installed (pip install -e '.[bench]')")
    args = bench.parse_args(TINY)
    trl = bench.run_trl(args, model, tmp_path)
    _check(trl, args)
    assert all(0 < it["update_s"] < it["seconds"] for it in trl["iterations"])  # the step less its generation
    # the report pairs the sides; a fake trajlake result with twice TRL's speed gives a ratio of 2
    fast = {**trl, "side": "trajlake", "iterations": [
        {**it, "seconds": it["seconds"] / 2, "loop_seconds": it["seconds"] / 2, "collect_s": 0.0,
         "update_s": it["update_s"] / 2} for it in trl["iterations"]]}
    rows = bench.report(args, ["trl", "trajlake"], [{"trl": trl, "trajlake": fast}], (1.0, 1.0, 1.0),
                        {"params": bench.count_params(model), "peak": 1e9})
    assert rows[0]["ratio"] == pytest.approx(2.0)
    assert rows[0]["trajlake"]["mfu"] == pytest.approx(2 * rows[0]["trl"]["mfu"])  # the same work in half the time
    assert rows[0]["ratio_update"] == pytest.approx(2.0)
    assert rows[0]["trajlake"]["update_mfu"] == pytest.approx(2 * rows[0]["trl"]["update_mfu"])
    out = capsys.readouterr().out
    assert "trajlake / TRL tokens/s: 2.00x" in out and "MFU" in out
    assert "the update alone:" in out and ": 2.00x" in out


def test_cli_checks(bench):
    with pytest.raises(SystemExit):
        bench.parse_args(["--samples", "1"])
    with pytest.raises(SystemExit):
        bench.parse_args(["--prompts", "3", "--samples", "2", "--micro-batch", "4"])


def test_headline_rows(bench, tmp_path):
    from headline import read_rows

    args = bench.parse_args(["--quick", "--json", str(tmp_path / "rows.json")])
    assert (args.rounds, args.repeats) == (2, 2)
    rounds = [{"round": k, "trajlake": {"tokens": 100, "seconds": s}, "trl": {"tokens": 90, "seconds": 2.0},
               "ratio": 90 / s / 45, "ratio_loop": 1.0} for k, s in ((1, 1.0), (2, 3.0))]
    bench.write_rows(args.json, bench.headlines(args, rounds, (1.0, 1.0, 1.0)))
    (row,) = read_rows(args.json)
    assert row["stage"] == "GRPO iteration: tiny model, 16x4x48" and row["unit"] == "tokens/s"
    assert row["trajlake_value"] == pytest.approx(50.0) and row["alternative_value"] == pytest.approx(45.0)
    assert row["target"] == 2.5 and row["met"] is False and "2 rounds" in row["note"]
    smol = bench.headlines(bench.parse_args(["--model", "models/smollm2", "--prompts", "4"]), rounds, (0, 0, 0))
    assert smol[0].stage == "GRPO iteration: smollm2, 4x4x48" and smol[0].target == 1.5
    one_side = [{"round": 1, "trajlake": rounds[0]["trajlake"]}]
    assert bench.headlines(args, one_side, (0, 0, 0)) == []


def test_mfu_counts_every_sequence_token_against_the_measured_peak(bench, model):
    import torch
    from transformers import AutoModelForCausalLM

    loaded = AutoModelForCausalLM.from_pretrained(model)
    unique = {id(p): p.numel() for p in loaded.parameters()}  # a tied matrix once, as the file holds it
    assert bench.count_params(model) == sum(unique.values())
    threads = torch.get_num_threads()
    assert bench.matmul_peak(1, n=256, repeats=2) > 1e6 and torch.get_num_threads() == threads
    # 2 iterations of 50 prompt tokens and 100 reply tokens in all: 200 tokens x 8 x 1000 params in 2 s of 1 MFLOP/s
    assert bench.mfu({"iterations": 2, "tokens": 100, "seconds": 2.0}, 50, 1000, 1e6) == pytest.approx(0.8)
    # the update's 6 of those 8 FLOPs per parameter and token, over its own 0.6 s an iteration
    summary = {"iterations": 2, "tokens": 100, "seconds": 2.0, "update_s": 0.6}
    assert bench.mfu(summary, 50, 1000, 1e6, update=True) == pytest.approx(1.0)
