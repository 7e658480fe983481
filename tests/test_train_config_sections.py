"""TrainConfig's sections (train/config_sections.py, train/config_update.py): a nested config, `cfg.kl.coef`,
whose leaves each have one flat name; a TOML file written in sections loads as the same config as the flat one
(the same run); a run holds only the sections its algo uses; and a key a section does not have, a field given
twice, or a renamed table is refused in one line."""

from __future__ import annotations

import dataclasses
import tomllib

import pytest

from trajlake.core.config_types import leaf_fields
from trajlake.train.algos.algorithms import ALGOS
from trajlake.train.config import (
    CONFIGS_DIR,
    LEAVES,
    SECTIONS,
    ConfigError,
    TrainConfig,
    config_from_dict,
    dotted,
    flatten,
    load_config,
)
from trajlake.train.config_sections import Section


def test_every_field_is_a_leaf_of_one_section_with_a_unique_flat_name():
    assert all(issubclass(cls, Section) and cls.key == key for key, cls in SECTIONS.items())
    assert [f.name for f in dataclasses.fields(TrainConfig)] == list(SECTIONS)  # the config is its sections
    leaves = leaf_fields(TrainConfig)
    assert len({name for name, _, _ in leaves}) == len(leaves) == len(LEAVES)
    # no section is also a flat name: a flat file's key could not be told from a table
    assert not set(SECTIONS) & set(LEAVES)
    for key, cls in SECTIONS.items():
        assert set(cls.flat_names) <= {f.name for f in dataclasses.fields(cls)}, key


def test_dotted_names_are_the_section_and_the_field():
    assert dotted("kl_coef") == "kl.coef" and dotted("run_id") == "run.id" and dotted("eval_every") == "eval.every"
    assert dotted("lr") == "optim.lr" and dotted("rollout_engine") == "rollout.engine"
    assert dotted("sft_filter") == "sft.filter" and dotted("checkpoint_dir") == "checkpoint.dir"
    assert dotted("async_collectors") == "asynchronous.collectors"
    cfg = config_from_dict({"model": "m", "kl_coef": 0.01, "checkpoint_dir": "c"})
    for name in LEAVES:  # every flat name reads the leaf its dotted name reaches
        key, short = dotted(name).split(".")
        section = getattr(cfg, key)  # None: a section this algo does not use (sft, for grpo)
        assert cfg.value(name) == (None if section is None else getattr(section, short)), name


def test_a_sectioned_file_is_the_same_config_as_the_flat_one(tmp_path):
    flat = tmp_path / "flat.toml"
    flat.write_text('model = "m"\nrun_id = "r"\nkl_coef = 0.01\nlr = 2e-6\ntemperature = 0.7\neval_every = 2\n')
    sectioned = tmp_path / "sections.toml"
    sectioned.write_text('[run]\nmodel = "m"\nid = "r"\n\n[kl]\ncoef = 0.01\n\n[optim]\nlr = 2e-6\n\n'
                         '[rollout]\ntemperature = 0.7\n\n[eval]\nevery = 2\n')
    a, b = load_config(flat), load_config(sectioned)
    assert a == b and b.kl.coef == 0.01 and b.run.id == "r" and b.eval.every == 2 and b.optim.lr == 2e-6
    assert a.to_dict() == b.to_dict()  # the stored config, and so the run, does not depend on the file's form
    assert load_config(sectioned, kl_coef=0.02).kl.coef == 0.02  # an override replaces a section's value


def test_sections_given_as_tables_or_instances_make_the_same_config():
    by_table = TrainConfig(run={"model": "m"}, kl={"coef": 0.01}, optim={"lr": 2e-6})
    by_flat = config_from_dict({"model": "m", "kl_coef": 0.01, "lr": 2e-6})
    by_instance = TrainConfig(run=by_table.run, kl=by_table.kl, optim=by_table.optim)
    assert by_table == by_flat == by_instance
    assert by_flat.replace(kl={"coef": 0.02}).kl.coef == by_flat.replace(kl_coef=0.02).kl.coef == 0.02
    assert by_flat.replace(kl={"coef": 0.02}).kl.estimator == by_flat.kl.estimator  # a table merges into it


def test_a_run_holds_only_the_sections_its_algo_uses():
    sft = config_from_dict({"model": "m", "algo": "sft", "sft_steps": 3})
    assert sft.kl is None and sft.algorithm is None and sft.critic is None and sft.data is None
    assert sft.sft.steps == 3 and sft.optim is not None and sft.rollout is not None
    stored = sft.to_dict()
    assert "kl_coef" not in stored and "advantage" not in stored and stored["sft_steps"] == 3
    rl = config_from_dict({"model": "m"})
    assert rl.sft is None and "sft_steps" not in rl.to_dict() and rl.kl.coef == 0.001
    for name in ALGOS.names():  # each algo's sections are TrainConfig's
        assert set(ALGOS[name].sections) <= set(SECTIONS)
    # a section at its defaults is dropped when the algo does not use it; one with a value given is refused
    assert rl.replace(algo="sft").kl is None
    with pytest.raises(ConfigError, match=r"^train config: algo sft has no \[kl\] section; leave out kl_coef$"):
        config_from_dict({"model": "m", "algo": "sft", "kl_coef": 0.1})
    with pytest.raises(ConfigError, match=r"algo grpo has no \[sft\] section; leave out sft_filter"):
        config_from_dict({"model": "m", "sft": {"filter": "success AND reward > 0"}})


def test_every_shipped_config_is_written_in_sections_and_loads():
    for path in sorted(CONFIGS_DIR.glob("*.toml")):
        data = tomllib.loads(path.read_text())
        assert set(data) <= set(SECTIONS), f"{path.name}: keys outside a section: {set(data) - set(SECTIONS)}"
        load_config(path)


@pytest.mark.parametrize("text, message", [
    ('[kl]\ncoeff = 0.1\n', r"c\.toml: \[kl\] has no key 'coeff'; valid: coef, estimator, mode, controller, "
                            r"target, horizon$"),
    ('kl_coef = 0.1\n[kl]\ncoef = 0.2\n', r"c\.toml: kl_coef is given twice, at the top level and as coef in "
                                          r"\[kl\]$"),
    ('[optim]\nlr = "fast"\n', r"lr must be a number"),
    ('[kl]\ncoef = "high"\n', r"kl_coef must be a number"),  # named by its flat name, as every message does
    ('[loss]\nclip = 0.2\n', r"unknown.*loss"),
    ('[async]\ncollectors = 2\n', r"c\.toml: the \[async\] section is now \[asynchronous\]; rename the table$"),
    ('kl = 3\n', r"\[kl\] must be a table of its fields, got 3"),
])
def test_a_bad_section_is_refused_in_one_line(tmp_path, text, message):
    p = tmp_path / "c.toml"
    p.write_text('model = "m"\n' + text)
    with pytest.raises(ConfigError, match=message) as e:
        load_config(p)
    assert "\n" not in str(e.value)


def test_flatten_leaves_a_flat_config_as_it_is():
    data = {"model": "m", "lr": 1e-6, "report_to": ["wandb"]}
    assert flatten(data, "x") == data


def test_a_config_stored_before_the_sections_reads_back_as_its_run():
    """A run stored before the sections holds every field, an RL run's `sft_steps` too (here one a recipe set):
    read back (replay), it is the run's config, the other loop's fields and the keys stored beside them left out."""
    from trajlake.core.config_types import leaf_values
    from trajlake.train.config import config_from_stored

    rl = config_from_dict({"model": "m", "kl_coef": 0.01, "run_id": "r"})
    everything = {**leaf_values(TrainConfig(run={"model": "m", "algo": "sft"}, sft={"steps": 60})),
                  **leaf_values(rl), "start_policy": "m", "algo": "grpo"}
    assert "sft_steps" in everything and "kl_coef" in everything
    assert config_from_stored(everything, "stored") == rl
    assert config_from_stored(everything, "stored", run_id=None).run.id is None
    sft = config_from_stored({**everything, "algo": "sft"}, "stored")
    assert sft.sft.steps == 60 and sft.kl is None


@pytest.mark.parametrize("args, message", [
    (["--config", str(CONFIGS_DIR / "sft-doors.toml"), "--kl.coef", "0.1"],
     "sft-doors.toml: train config: algo sft has no [kl] section; leave out kl_coef"),
    (["--config", "{old}"], "the [async] section is now [asynchronous]; rename the table"),
])
def test_the_train_command_refuses_a_section_in_one_line_before_any_lake_is_made(tmp_path, args, message):
    import subprocess
    import sys

    old = tmp_path / "old.toml"
    old.write_text('[run]\nmodel = "m"\n\n[async]\ncollectors = 2\n')
    lake = tmp_path / "lake"
    out = subprocess.run([sys.executable, "-m", "trajlake", "--lake", str(lake), "train",
                          *[a.format(old=old) for a in args]], capture_output=True, text=True, timeout=120)
    assert out.returncode == 1 and message in out.stderr, out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and not lake.exists()
