"""report_to (train/trackers.py): every train_steps row also goes to TensorBoard and W&B (offline) under the
peers' metric names; read back from the event files and the offline run's files."""

from __future__ import annotations

import json

import pytest

from tests.helpers import small_cfg, tiny_model_dir, varied_spec
from trajlake.core.errors import TrajlakeError
from trajlake.store import Lake
from trajlake.train.config import ConfigError
from trajlake.train.loop import train
from trajlake.train.trackers import peer_metrics

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_peer_names_and_derived_metrics():
    m = peer_metrics({"pg_loss": 0.5, "critic_vf_loss": 1.0, "success_mean": 0.25, "agent_tokens": 40,
                      "episodes": 4, "episodes_where": "run_id = 'x'", "warning": "w", "odd": float("nan"),
                      "custom": 3, "flag": True})
    assert m == {"actor/pg_loss": 0.5, "critic/vf_loss": 1.0, "env/success_rate": 0.25,
                 "response_length/sum": 40.0, "rollout/episodes": 4.0, "response_length/mean": 10.0,
                 "trajlake/custom": 3.0}


@pytest.mark.slow  # 6 s: a GRPO run with both trackers
def test_grpo_reports_to_tensorboard_and_wandb_offline(tmp_path, tmp_path_factory, monkeypatch):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc login: W&B must go offline by itself
    model = tiny_model_dir(tmp_path_factory)
    cfg = small_cfg(model, run_id="tb-run", tasks=2, samples=2, iterations=2, minibatch_size=4, micro_batch=2,
                    reward_spec=varied_spec(tmp_path), checkpoint_dir=str(tmp_path / "ckpt"),
                    report_to=["tensorboard", "wandb"])
    with Lake.open(str(tmp_path / "lake")) as lake:
        res = train(cfg, lake)
        stored = {r["step"]: json.loads(r["metrics"]) if isinstance(r["metrics"], str) else r["metrics"]
                  for r in lake.query("SELECT step, metrics FROM train_steps WHERE run_id = 'tb-run'").to_dicts()}
    folder = tmp_path / "ckpt" / "tb-run"
    events = EventAccumulator(str(folder / "tensorboard"))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert {"actor/pg_loss", "env/success_rate", "response_length/mean", "critic/score/mean",
            "timing_s/gen"} <= tags
    success = [(e.step, e.value) for e in events.Scalars("env/success_rate")]
    assert success == [(s, pytest.approx(stored[s]["success_mean"])) for s in (1, 2)]
    lengths = events.Scalars("response_length/mean")
    assert lengths[-1].value == pytest.approx(stored[2]["agent_tokens"] / stored[2]["episodes"])
    runs = list((folder / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(runs) == 1 and res.step == 2
    history = wandb_history(runs[0])
    assert [h["_step"] for h in history] == [1, 2]
    for h in history:
        assert h["env/success_rate"] == pytest.approx(stored[h["_step"]]["success_mean"])
        assert h["actor/pg_loss"] == pytest.approx(stored[h["_step"]]["pg_loss"], abs=1e-6)


def wandb_history(path) -> list[dict]:
    """The history rows of an offline W&B run file: a LevelDB-style log (a 7-byte header, then 32 KiB blocks
    of records, each a 7-byte header of crc, length and kind: full, first, middle or last) of protobuf
    Records, read back with W&B's own message types."""
    import struct

    from wandb.proto import wandb_internal_pb2 as pb

    data, pos, block, buf, out = path.read_bytes(), 7, 32768, b"", []
    assert data[:4] == b":W&B"
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        _, n, kind = struct.unpack("<IHB", data[pos:pos + 7])
        chunk, pos = data[pos + 7:pos + 7 + n], pos + 7 + n
        buf = chunk if kind in (1, 2) else buf + chunk
        if kind in (1, 4):
            record = pb.Record()
            record.ParseFromString(buf)
            if record.WhichOneof("record_type") == "history":
                out.append({i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in record.history.item})
    return out


def test_unknown_tracker_is_refused_naming_the_valid_ones(tmp_path):
    with pytest.raises(ConfigError, match=r"unknown report_to \['mlflow'\]; valid: tensorboard, wandb"):
        small_cfg(tmp_path, report_to=["mlflow"])


def test_a_tracker_not_installed_fails_before_any_write(tmp_path, tmp_path_factory, monkeypatch):
    import builtins

    real = builtins.__import__

    def no_wandb(name, *a, **kw):
        if name == "wandb":
            raise ImportError("No module named 'wandb'", name="wandb")
        return real(name, *a, **kw)

    monkeypatch.setattr(builtins, "__import__", no_wandb)
    model = tiny_model_dir(tmp_path_factory)
    cfg = small_cfg(model, run_id="nowandb", tasks=2, samples=2, iterations=1, minibatch_size=4, micro_batch=2,
                    checkpoint_dir=str(tmp_path / "ckpt"), report_to=["wandb"])
    with Lake.open(str(tmp_path / "lake")) as lake:
        with pytest.raises(TrajlakeError, match=r"report_to wandb: wandb is not installed \(pip install"):
            train(cfg, lake)
        assert lake.query("SELECT count(*) FROM runs").item() == 0
