"""The CLI's shape: commands registered by their group modules, the train overrides made once from TrainConfig
for both `trajlake train` and `python -m trajlake.train`, and `train` made only when it is asked for."""

import re
import subprocess
import sys

import pytest
import typer
from typer.testing import CliRunner

from trajlake.cli import app, main
from trajlake.cli.app import HELP_ORDER
from trajlake.collect.config import ROLLOUT_FIELDS, CollectConfig
from trajlake.core.config_types import field_docs
from trajlake.evaluate.config import EvalConfig
from trajlake.train.__main__ import parser
from trajlake.train.config import LEAVES, SECTIONS, TrainConfig
from trajlake.train.overrides import dotted_option, given_overrides, option_name, override_fields, override_specs


def test_every_command_is_listed_in_the_pipeline_order():
    group = typer.main.get_command(app)
    with group.make_context("trajlake", ["sql"]) as ctx:
        listed = group.list_commands(ctx)
    assert listed == list(HELP_ORDER)  # every registered command is named in HELP_ORDER, and only those


def test_train_options_are_the_overrides_with_the_field_docs_as_help():
    out = CliRunner().invoke(app, ["train", "--help"], env={"COLUMNS": "300"}).output
    text = " ".join(word for word in out.split() if word != "│")  # the words, without the table's borders
    docs = field_docs(TrainConfig)
    fields = override_fields()
    assert set(fields) == set(LEAVES)  # every field (by flat name), each with its doc
    for field in fields:
        assert option_name(field) in out and dotted_option(field) in out, field
        assert docs[field] in text, field  # the field's help is the option's help, whole
    panels = re.findall(r"Config overrides: (\w+)", out)  # one panel a section, in SECTIONS' order
    assert panels == list(SECTIONS)


def test_python_m_train_takes_the_same_overrides_typed_by_the_fields():
    options = override_specs()
    p = parser(options)
    assert sorted(o.field for o in options) == sorted(override_fields())
    args = p.parse_args(["--config", "c.toml", "--iterations", "3", "--data.train-snapshot", "7", "--report-to",
                         "tensorboard", "--run.report-to", "wandb", "--run.id", "r1", "--no-rotate-tasks",
                         "--checkpoint.save-optimizer", "--kl.coef", "0.01", "--min-outcome-groups", "2"])
    got = given_overrides({o.field: getattr(args, o.field) for o in options})
    assert got == {"iterations": 3, "train_snapshot": 7, "report_to": ["tensorboard", "wandb"], "run_id": "r1",
                   "rotate_tasks": False, "save_optimizer": True, "kl_coef": 0.01, "min_outcome_groups": 2}
    assert "grpo/%'" in p.format_help()  # a % in a field's doc is shown, not taken for a format
    with pytest.raises(SystemExit):
        p.parse_args(["--config", "c.toml", "--iterations", "many"])


def test_given_overrides_drop_what_was_not_given():
    # an empty repeated option would replace the config's trackers with none
    assert given_overrides({"algo": None, "report_to": [], "iterations": 0}) == {"iterations": 0}


def test_replay_names_every_override_given_beside_it(capsys):
    argv = ["train", "--replay", "x", "--step", "1", "--iterations", "3", "--report-to", "a", "--model", "m"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "(drop --model, --iterations, --report-to)" in err, err


def test_a_command_other_than_train_does_not_import_torch(tmp_path):
    # `train` is made from TrainConfig, whose module imports torch: every other command starts without it
    code = ("import sys; from trajlake.cli import main; "
            f"rc = main(['--lake', {str(tmp_path / 'none')!r}, 'tables']); "
            "print(rc, 'torch' in sys.modules)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.stdout.split() == ["1", "False"], r.stdout + r.stderr


def test_an_unknown_command_is_matched_against_the_lazy_ones_too(capsys):
    assert main(["trian"]) == 2
    assert "Did you mean 'train'?" in capsys.readouterr().err


@pytest.mark.parametrize("command, cls", [("collect", CollectConfig), ("evaluate", EvalConfig)])
def test_rollout_options_show_each_field_doc_whole(command, cls):
    out = CliRunner().invoke(app, [command, "--help"], env={"COLUMNS": "300"}).output
    text = " ".join(word for word in out.split() if word != "│")
    docs = field_docs(cls)
    for field in ROLLOUT_FIELDS:
        assert docs[field] in text, field  # nothing of it taken for markup


def test_a_field_the_command_line_cannot_spell_is_refused_as_an_override():
    from trajlake.train.overrides import _option_type

    assert _option_type("train_snapshot", int | None) == (int, False)
    assert _option_type("report_to", tuple[str, ...]) == (str, True)
    assert _option_type("progress", bool) == (bool, False)  # --progress/--no-progress
    with pytest.raises(TypeError, match="extras"):  # a mapping needs a file
        _option_type("extras", dict[str, int])
