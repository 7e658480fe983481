"""Train run contracts: a restarted run id is held to the settings it was started with (RUN_FIELDS), and a train
command refused for a user error prints one line naming the field and leaves the lake exactly as it was (same
snapshots, same rows); only a run that started training keeps its row, as failed."""

from __future__ import annotations

import json

import pytest

from tests.helpers import expert_lake, small_cfg, tiny_model_dir
from trajlake.cli import main
from trajlake.core.errors import TrajlakeError
from trajlake.store import Lake
from trajlake.train.config import RESUMABLE_FIELDS, RUN_FIELDS, ConfigError, TrainConfig, config_from_dict
from trajlake.train.loop import train

pytestmark = pytest.mark.usefixtures("one_torch_thread")

TABLES = ("runs", "episodes", "train_steps", "policies")


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return tiny_model_dir(tmp_path_factory)


@pytest.fixture
def lake(tmp_path, model):
    """A lake holding 4 scripted-expert episodes (run `expert`), the SFT data."""
    lk = expert_lake(tmp_path / "lake", model)
    yield lk
    lk.close()


def state(lake: Lake) -> tuple:
    """What a refused command must leave as it was: every snapshot, and the row counts of the tables it writes."""
    return lake.snapshots().to_dicts(), {t: lake.count(t) for t in TABLES}


def refused(lake: Lake, cfg: TrainConfig, match: str) -> str:
    """Train `cfg`, expecting a refusal whose message contains `match`; the lake must be unchanged."""
    before = state(lake)
    with pytest.raises(TrajlakeError) as e:
        train(cfg, lake)
    assert match in str(e.value), str(e.value)
    assert "\n" not in str(e.value)
    assert state(lake) == before, "a refused train command wrote to the lake"
    return str(e.value)


def cli_refused(tmp_path, capsys, toml: str, *args: str) -> str:
    """`trajlake train` with the config `toml`: exit 1, one `error:` line (returned), the lake unchanged."""
    uri = str(tmp_path / "lake")
    cfg = tmp_path / "c.toml"
    cfg.write_text(toml)
    with Lake.open(uri) as lk:
        before = state(lk)
    capsys.readouterr()
    assert main(["--lake", uri, "train", "--config", str(cfg), *args]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    errors = [line for line in err if line.startswith("error:")]
    assert len(errors) == 1 and err[-1] == errors[0], err
    with Lake.open(uri) as lk:
        assert state(lk) == before, "a refused train command wrote to the lake"
    return errors[0]


def sft_toml(model_dir, **kw) -> str:
    base = dict(model=str(model_dir), algo="sft", sft_steps=1, minibatch_size=4, micro_batch=4, progress=False,
                checkpoint_dir="ckpt", save_optimizer=False)
    base.update(kw)
    return "".join(f"{k} = {json.dumps(v)}\n" for k, v in base.items())


# ---- user errors: one line naming the field, nothing written ------------------------------------------


@pytest.mark.parametrize("kw, words", [
    (dict(sft_filter="nosuchcol AND"), ["sft_filter 'nosuchcol AND' is not a SQL filter", "syntax error"]),
    (dict(sft_filter="nosuchcol"), ["sft_filter 'nosuchcol' is not a SQL filter", '"nosuchcol" not found']),
    (dict(sft_filter="false"), ["no episodes match sft_filter (false)"]),
    (dict(sft_filter="success AND env = 'maze'"), ["no episodes match sft_filter"]),
    (dict(sft_snapshot=999), ["sft_snapshot 999 is not a snapshot"]),
    (dict(lr="fast"), ["train config: lr must be a number, got 'fast' (str)"]),
    (dict(sft_steps=True), ["sft_steps must be an integer, got True"]),
    (dict(model="/nonexistent"), ["train config: model '/nonexistent': no model at /nonexistent"]),
    (dict(model="run:nope"), ["train config: model 'run:nope': train run 'nope' has no checkpoint"]),
    (dict(template="xml"), ["unknown template 'xml'"]),
])
def test_cli_train_user_errors_name_the_field_and_write_nothing(lake, model, tmp_path, capsys, kw, words):
    lake.close()  # the CLI opens the lake itself
    line = cli_refused(tmp_path, capsys, sft_toml(model, **kw), "--run-id", "s1")
    for w in words:
        assert w in line, line


@pytest.mark.parametrize("line, args, message", [
    ("lr = inf", (), "lr must be a finite number, got inf"),  # exited 0, storing a checkpoint of NaN weights
    ("micro_batch = 0", (), "micro_batch must be >= 1, got 0"),  # was a ZeroDivisionError traceback
    ("sft_steps = 1e23", (), "sft_steps must be an integer, got 1e+23 (float)"),
    ("sft_steps = 100000000000000000", (), "sft_steps must be at most 10_000_000"),  # trained without end
    ("temperature = inf", (), "temperature must be a finite number, got inf"),
    ("", ("--run-id", ""), "run_id must not be empty"),  # was replaced by a generated id
    ("", ("--run-id", "../../outside/escaped"), "run_id '../../outside/escaped' may hold only letters"),
])
def test_cli_train_refuses_bad_numbers_and_run_ids_in_one_line(lake, model, tmp_path, capsys, line, args, message):
    lake.close()
    key = line.split(" =")[0]
    toml = "".join(x + "\n" for x in sft_toml(model).splitlines() if not x.startswith(f"{key} =")) + line + "\n"
    got = cli_refused(tmp_path, capsys, toml, *(args or ("--run-id", "s1")))
    assert got.startswith("error: ") and message in got, got
    assert not (tmp_path / "outside").exists()


def test_an_sft_filter_is_one_expression_not_a_statement(lake, model):
    """The filter is pasted into queries and DuckDB runs every statement it is given: a `;` is refused before
    any query runs, so the episodes are still there."""
    cfg = small_cfg(model, algo="sft", run_id="s1", sft_steps=1, minibatch_size=4, micro_batch=4,
                    sft_filter="true); DELETE FROM episodes; SELECT (1")
    refused(lake, cfg, "train config: sft_filter 'true); DELETE FROM episodes; SELECT (1' is not a SQL filter")
    assert lake.count("episodes") == 4


def test_a_grpo_run_refused_before_training_writes_nothing(lake, model, tmp_path):
    """The reward spec is checked against the advantage before the run row is written."""
    spec = tmp_path / "disc.toml"
    spec.write_text('name = "disc"\n[allocation]\nstrategy = "discounted"\n[[components]]\nkind = "sql"\n'
                    'expr = "1.0"\n')
    cfg = small_cfg(model, run_id="g1", advantage="gigpo", reward_spec=str(spec), tasks=2, samples=2,
                    minibatch_size=4, micro_batch=4)
    refused(lake, cfg, "train config: advantage gigpo discounts across turns itself")
    # the rollouts' settings are collect's own (RolloutConfig), checked when the config is made
    with pytest.raises(ConfigError, match=r"^train config: max_context_tokens \(2048\) must exceed max_new_tokens"):
        cfg.replace(reward_spec=None, max_new_tokens=2048)


# ---- run contracts ------------------------------------------------------------------------------------


def test_run_and_resumable_fields_cover_every_field():
    from trajlake.train.config import LEAVES

    names = set(LEAVES)  # every leaf of every section, by flat name
    assert set(RUN_FIELDS) | set(RESUMABLE_FIELDS) == names and not set(RUN_FIELDS) & set(RESUMABLE_FIELDS)
    assert {"model", "algo", "lr", "seed", "sft_filter", "env", "reward_spec"} <= set(RUN_FIELDS)


def test_a_restarted_sft_run_is_held_to_its_settings(lake, model):
    sft = dict(algo="sft", run_id="s1", sft_steps=1, minibatch_size=4, micro_batch=4, lr=3e-3)
    assert train(small_cfg(model, **sft), lake).step == 1
    assert lake.query("SELECT status FROM runs WHERE run_id = 's1'")[0, 0] == "finished"

    # other settings: refused naming every field that differs, with its stored and given value
    msg = refused(lake, small_cfg(model, **{**sft, "lr": 1e-3, "seed": 1}), "run s1 already exists with ")
    assert msg == "run s1 already exists with seed 0, lr 0.003; given seed 1, lr 0.001 (use a new --run-id)"
    as_grpo = {k: v for k, v in sft.items() if k != "sft_steps"}  # a grpo run has no [sft] section
    refused(lake, small_cfg(model, **{**as_grpo, "algo": "grpo"}), "algo 'sft'")
    refused(lake, small_cfg(model, **{**sft, "sft_filter": "success AND num_turns = 1"}), "sft_filter 'success'")
    refused(lake, small_cfg("policy:expert-nope", **sft), "model 'policy:expert-nope': no checkpoint for policy")

    # what may change: more steps, how it reports, where it checkpoints; hf:PATH is the same start as PATH
    res = train(small_cfg(f"hf:{model}", **{**sft, "sft_steps": 2, "log_every": 5, "checkpoint_dir": "ckpt2"}), lake)
    assert res.step == 2 and res.history[0]["step"] == 2  # resumed: only step 2 was trained
    row = lake.query("SELECT status, config FROM runs WHERE run_id = 's1'").row(0, named=True)
    config = json.loads(row["config"]) if isinstance(row["config"], str) else row["config"]
    assert row["status"] == "finished" and config["sft_steps"] == 2 and config["checkpoint_dir"] == "ckpt2"
    assert config["start_policy"] == f"hf:{model.absolute()}"

    # fewer steps than the run has done: refused, naming sft_steps
    refused(lake, small_cfg(model, **sft), "train config: sft_steps 1 is fewer than the 2 run s1 has done already")


def test_a_failed_run_restarted_with_other_settings_stays_failed(lake, model, flaky_env):
    """The issue's case: a run that failed once training had started keeps its row, as failed; restarting its
    id with another config is refused (it used to flip to `finished` under the old config)."""
    cfg = small_cfg(model, env="test-flaky", run_id="tf", tasks=2, samples=2, iterations=1, minibatch_size=4,
                    micro_batch=4)
    flaky_env.down = True
    with pytest.raises(TrajlakeError, match="collect run tf/it-1 failed"):
        train(cfg, lake)
    assert lake.query("SELECT status FROM runs WHERE run_id = 'tf'")[0, 0] == "failed"
    flaky_env.down = False
    refused(lake, cfg.replace(samples=4, minibatch_size=8),
            "run tf already exists with samples 2, minibatch_size 4; given samples 4, minibatch_size 8 "
            "(use a new --run-id)")
    assert lake.query("SELECT status FROM runs WHERE run_id = 'tf'")[0, 0] == "failed"


def test_a_collect_run_id_is_not_a_train_run(lake, model):
    cfg = small_cfg(model, algo="sft", run_id="expert", sft_steps=1, minibatch_size=4, micro_batch=4)
    refused(lake, cfg, "run expert already exists as a collect run, not a train run (use a new --run-id)")


def test_differences_compare_model_by_the_policy_it_resolves_to():
    stored = {**config_from_dict(dict(model="run:sft")).to_dict(), "start_policy": "sft/step-4"}
    assert config_from_dict(dict(model="run:sft")).differences(stored, start_policy="sft/step-4") == []
    assert config_from_dict(dict(model="policy:sft/step-4")).differences(stored, start_policy="sft/step-4") == []
    assert config_from_dict(dict(model="run:sft")).differences(stored, start_policy="sft/step-8") == [
        ("model", "run:sft (policy sft/step-4)", "run:sft (policy sft/step-8)")]
    # advantage None is the algo's default estimator; a stored config without a field does not compare it
    given = config_from_dict(dict(model="run:sft", advantage="grpo"))
    assert given.differences(stored, start_policy="sft/step-4") == []
    old = {k: v for k, v in stored.items() if k != "turn_baseline"}
    given = config_from_dict(dict(model="run:sft", turn_baseline="turn"))
    assert given.differences(old, start_policy="sft/step-4") == []
    with pytest.raises(ConfigError):
        config_from_dict(dict(model="m", iterations="10"))


def test_differences_compare_reward_spec_by_content():
    stored = {**config_from_dict(dict(model="m", reward_spec="a.toml")).to_dict(), "reward_spec_id": "s1"}
    assert config_from_dict(dict(model="m", reward_spec="copy/a.toml")).differences(stored, spec_id="s1") == []
    assert config_from_dict(dict(model="m", reward_spec="a.toml")).differences(stored, spec_id="s2") == [
        ("reward_spec", "a.toml (spec s1)", "a.toml (spec s2)")]


def test_a_restart_with_an_edited_reward_spec_is_refused(lake, model, tmp_path):
    """The same spec path with other content is another run; the same content at another path is the same."""
    spec = tmp_path / "spec.toml"
    spec.write_text('name = "s"\n[[components]]\nkind = "sql"\nexpr = "1.0"\n')
    cfg = small_cfg(model, run_id="g1", reward_spec=str(spec), tasks=2, samples=2, iterations=1,
                    minibatch_size=4, micro_batch=4)
    train(cfg, lake)
    stored = lake.query("SELECT config FROM runs WHERE run_id = 'g1'")[0, 0]
    stored = json.loads(stored) if isinstance(stored, str) else stored
    assert stored["reward_spec_id"]
    copy = tmp_path / "copy.toml"
    copy.write_text(spec.read_text())
    assert train(cfg.replace(reward_spec=str(copy)), lake).step == 1  # same content: the same run, nothing left
    spec.write_text('name = "s"\n[[components]]\nkind = "sql"\nexpr = "2.0"\n')
    msg = refused(lake, cfg, "run g1 already exists with reward_spec '")  # long paths are cut in the message
    assert "copy.toml" in msg and "given '" in msg and "spec.toml" in msg
