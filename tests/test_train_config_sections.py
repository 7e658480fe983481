"""TrainConfig's sections (train/config_sections.py): every field in one, a TOML file written in sections loads as
the same config as the flat one (the same run), and a key a section does not have, or a field given twice, is
refused in one line."""

from __future__ import annotations

import dataclasses

import pytest

from trajlake.train.config import CONFIGS_DIR, ConfigError, TrainConfig, load_config
from trajlake.train.config_sections import SECTION_OF, SECTIONS, dotted, flatten, short_name

FIELDS = [f.name for f in dataclasses.fields(TrainConfig)]


def test_every_field_is_in_exactly_one_section_in_declaration_order():
    listed = [f for _, fields in SECTIONS.values() for f in fields]
    assert sorted(listed) == sorted(FIELDS) and len(listed) == len(set(listed))
    for name, (what, fields) in SECTIONS.items():
        assert what and list(fields) == [f for f in FIELDS if SECTION_OF[f] == name], name
    # no section is also a field's name: a flat file's key could not be told from a table
    assert not set(SECTIONS) & set(FIELDS)


def test_dotted_names_drop_the_sections_own_prefix():
    assert dotted("kl_coef") == "kl.coef" and dotted("run_id") == "run.id" and dotted("eval_every") == "eval.every"
    assert dotted("lr") == "optim.lr" and dotted("rollout_engine") == "rollout.engine"
    assert dotted("sft_filter") == "sft.filter" and dotted("checkpoint_dir") == "checkpoint.dir"
    assert len({dotted(f) for f in FIELDS}) == len(FIELDS)  # one field a name
    assert all(short_name(f) for f in FIELDS)


def test_a_sectioned_file_is_the_same_config_as_the_flat_one(tmp_path):
    flat = tmp_path / "flat.toml"
    flat.write_text('model = "m"\nrun_id = "r"\nkl_coef = 0.01\nlr = 2e-6\ntemperature = 0.7\neval_every = 2\n')
    sectioned = tmp_path / "sections.toml"
    sectioned.write_text('[run]\nmodel = "m"\nid = "r"\n\n[kl]\ncoef = 0.01\n\n[optim]\nlr = 2e-6\n\n'
                         '[rollout]\ntemperature = 0.7\n\n[eval]\nevery = 2\n')
    a, b = load_config(flat), load_config(sectioned)
    assert a == b and b.kl_coef == 0.01 and b.run_id == "r" and b.eval_every == 2
    assert a.to_dict() == b.to_dict()  # the stored config, and so the run, does not depend on the file's form
    assert load_config(sectioned, kl_coef=0.02).kl_coef == 0.02  # an override replaces a section's value


def test_every_shipped_config_is_written_in_sections_and_loads():
    for path in sorted(CONFIGS_DIR.glob("*.toml")):
        import tomllib

        data = tomllib.loads(path.read_text())
        assert set(data) <= set(SECTIONS), f"{path.name}: keys outside a section: {set(data) - set(SECTIONS)}"
        load_config(path)


@pytest.mark.parametrize("text, message", [
    ('[kl]\ncoeff = 0.1\n', r"c\.toml: \[kl\] has no key 'coeff'; valid: coef, estimator, mode, controller, "
                            r"target, horizon$"),
    ('kl_coef = 0.1\n[kl]\ncoef = 0.2\n', r"c\.toml: kl_coef is given twice, at the top level and as coef in "
                                          r"\[kl\]$"),
    ('[optim]\nlr = "fast"\n', r"lr must be a number"),
    ('[loss]\nclip = 0.2\n', r"unknown.*loss"),
])
def test_a_bad_section_is_refused_in_one_line(tmp_path, text, message):
    p = tmp_path / "c.toml"
    p.write_text('model = "m"\n' + text)
    with pytest.raises(ConfigError, match=message) as e:
        load_config(p)
    assert "\n" not in str(e.value)


def test_flatten_leaves_a_flat_config_as_it_is():
    data = {"model": "m", "lr": 1e-6, "report_to": ["wandb"]}
    assert flatten(data, "x", ConfigError) == data
