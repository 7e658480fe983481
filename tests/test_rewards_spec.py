"""Reward specs: the documented example parses, ids hash the content, and every error names file:line."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from trajlake.rewards import DEFAULT_SPEC, SPECS_DIR, SpecError, load_spec, parse_spec
from trajlake.rewards.spec import STRATEGIES

#: The spec from the issue, as written there.
EXAMPLE = """\
name = "goal-and-turns"

[allocation]
strategy = "discounted"
gamma = 0.9

[[components]]
kind = "goal"
weight = 1.0

[[components]]
kind = "sql"
weight = 0.5
expr = "num_turns * 0.1"

[[components]]
kind = "format"
weight = 0.2
pattern = "<action>.*</action>"
"""

#: The same content, reformatted: comments, blank lines, spacing, key order, tables moved, ints for floats.
EXAMPLE_REFORMATTED = """\
# a comment at the top
name    =    "goal-and-turns"   # same name

[[components]]
weight=1.0     # the outcome
kind="goal"

[[components]]
expr = 'num_turns * 0.1'
kind = "sql"
weight = 0.5

[[components]]
pattern   =   '<action>.*</action>'
weight = 0.2
kind = "format"
over = "each"        # the default, written out

[allocation]
gamma = 0.9
strategy = "discounted"
"""


def write(tmp_path: Path, text: str, name: str = "spec.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def error_of(tmp_path: Path, text: str) -> tuple[str, int, str]:
    """Load `text` from a file; return (file, line, message) of the SpecError, checking its form."""
    path = write(tmp_path, text)
    with pytest.raises(SpecError) as info:
        load_spec(path)
    msg = str(info.value)
    m = re.match(r"^(.+?):(\d+): (.+)$", msg, re.S)
    assert m, f"error does not start with file:line: {msg!r}"
    assert m.group(1) == str(path)
    return m.group(1), int(m.group(2)), m.group(3)


def line_of(text: str, needle: str, nth: int = 1) -> int:
    hits = [n for n, line in enumerate(text.splitlines(), 1) if needle in line]
    return hits[nth - 1]


# ---- the example and the shipped specs ------------------------------------------------------------------
def test_example_spec_parses_as_written(tmp_path):
    spec = load_spec(write(tmp_path, EXAMPLE))
    assert spec.name == "goal-and-turns"
    assert spec.allocation.strategy == "discounted"
    assert spec.allocation.gamma == 0.9
    assert [(c.kind, c.name, c.weight) for c in spec.components] == [
        ("goal", "goal", 1.0), ("sql", "sql", 0.5), ("format", "format", 0.2)]
    assert spec.component("sql").params == {"expr": "num_turns * 0.1"}
    assert spec.component("format").params == {"pattern": "<action>.*</action>", "over": "each", "dotall": False,
                                                "envs": None}
    assert spec.component("goal").params == {"success": 1.0, "failure": -1.0, "mode": "episode", "truncated": "score"}
    assert [c.line for c in spec.components] == [7, 11, 16]
    assert spec.source == str(tmp_path / "spec.toml")


def test_shipped_specs_load():
    assert DEFAULT_SPEC.is_file()
    paths = sorted(SPECS_DIR.glob("*.toml"))
    assert len(paths) >= 3
    specs = [load_spec(p) for p in paths]
    assert len({s.spec_id for s in specs}) == len(specs)
    # the shipped example is the example (comments aside)
    assert load_spec(SPECS_DIR / "goal-and-turns.toml").spec_id == parse_spec(EXAMPLE).spec_id


def test_defaults():
    spec = parse_spec('name = "x"\n[[components]]\nkind = "goal"\n')
    assert spec.allocation.strategy == "last_token"
    assert spec.allocation.gamma == 1.0
    assert spec.components[0].weight == 1.0


def test_unnamed_components_of_one_kind_get_distinct_names():
    spec = parse_spec('name = "x"\n[[components]]\nkind = "goal"\n[[components]]\nkind = "goal"\nsuccess = 2.0\n')
    assert [c.name for c in spec.components] == ["goal", "goal_2"]


# ---- spec ids ---------------------------------------------------------------------------------------
def test_spec_id_ignores_comments_whitespace_key_order_and_spelled_out_defaults():
    a = parse_spec(EXAMPLE)
    b = parse_spec(EXAMPLE_REFORMATTED)
    assert a.spec_id == b.spec_id
    assert a.to_json() == b.to_json()
    assert re.fullmatch(r"[0-9a-f]{16}", a.spec_id)
    # the source is not content
    assert parse_spec(EXAMPLE, source="elsewhere.toml").spec_id == a.spec_id


def test_spec_id_is_stable_across_loads(tmp_path):
    first = load_spec(write(tmp_path, EXAMPLE, "a.toml")).spec_id
    assert load_spec(write(tmp_path, EXAMPLE, "b.toml")).spec_id == first
    assert parse_spec(EXAMPLE).spec_id == first


@pytest.mark.parametrize("change", [
    ('weight = 0.5', 'weight = 0.25'),
    ('num_turns * 0.1', 'num_turns * 0.2'),
    ('gamma = 0.9', 'gamma = 0.95'),
    ('strategy = "discounted"', 'strategy = "uniform_positive"'),
    ('name = "goal-and-turns"', 'name = "other"'),
    ('pattern = "<action>.*</action>"', 'pattern = "<action>.+</action>"'),
    ('pattern = "<action>.*</action>"', 'pattern = "<action>.*</action>"\nover = "last"'),
    ('kind = "goal"', 'kind = "goal"\nsuccess = 2.0'),
    ('kind = "goal"\n', 'kind = "goal"\nname = "outcome"\n'),
])
def test_spec_id_changes_with_content(change):
    old, new = change
    assert old in EXAMPLE
    assert parse_spec(EXAMPLE.replace(old, new, 1)).spec_id != parse_spec(EXAMPLE).spec_id


def test_parameters_added_later_keep_old_ids_at_their_old_meaning():
    """goal's mode and truncated, and format's dotall / envs came after specs were stored: at the value that keeps
    the old meaning they are left out of the id (spelled out or not), so the issue's example keeps the id it had."""
    example = parse_spec(EXAMPLE)
    assert example.spec_id == "bc4c83f92e07a8bd"
    spelled = EXAMPLE.replace('kind = "goal"\n', 'kind = "goal"\nmode = "episode"\ntruncated = "score"\n').replace(
        'pattern = "<action>.*</action>"', 'pattern = "<action>.*</action>"\ndotall = false')
    assert parse_spec(spelled).spec_id == example.spec_id
    for new in ('kind = "goal"\nmode = "openmanus"\n', 'kind = "goal"\ntruncated = "failure"\n',
                'kind = "format"\ndotall = true\n',
                'kind = "format"\nenvs = ["webshop"]\n'):
        kind = new.split("\n")[0] + "\n"
        assert parse_spec(EXAMPLE.replace(kind, new, 1)).spec_id != example.spec_id, new


def test_spec_id_depends_on_component_order():
    reordered = EXAMPLE.replace('kind = "goal"\nweight = 1.0', 'kind = "TMP"').replace(
        'kind = "format"\nweight = 0.2\npattern = "<action>.*</action>"', 'kind = "goal"\nweight = 1.0')
    reordered = reordered.replace('kind = "TMP"', 'kind = "format"\nweight = 0.2\npattern = "<action>.*</action>"')
    spec = parse_spec(reordered)
    assert [c.kind for c in spec.components] == ["format", "sql", "goal"]
    assert spec.spec_id != parse_spec(EXAMPLE).spec_id


# ---- errors: file and line ----------------------------------------------------------------------------
def component_error(tmp_path, body: str, nth: int = 2) -> tuple[int, str, str]:
    """A spec whose `nth` component is `body` (others valid); returns (line, message, text)."""
    blocks = ['[[components]]\nkind = "goal"\n'] * 3
    blocks[nth - 1] = "[[components]]\n" + body
    text = 'name = "t"\n\n[allocation]\nstrategy = "last_token"\n\n' + "\n".join(blocks)
    _, line, msg = error_of(tmp_path, text)
    return line, msg, text


@pytest.mark.parametrize("body, expected", [
    ('kind = "gaol"\n', r"unknown component kind 'gaol'.*goal"),
    ('weight = 1.0\n', r"needs a `kind` \(one of .*goal.*\), got None"),
    ('kind = 3\n', r"needs a `kind`.*got 3"),
    ('kind = "goal"\nsucess = 1.0\n', r"unknown parameter\(s\) sucess; goal takes failure, mode, success, truncated"),
    ('kind = "goal"\ntruncated = 0\n', r"truncated must be one of score, failure, got 0"),
    ('kind = "goal"\nmode = "openmanus"\ntruncated = "failure"\n', r'truncated = "failure" needs mode = "episode"'),
    ('kind = "goal"\nmode = "openmanus-rl"\n', r"mode must be one of episode, openmanus, got 'openmanus-rl'"),
    ('kind = "format"\npattern = "<action>(.*</action>"\n', r"bad regex"),
    # valid for Python's re but not for RE2, which the query uses
    ('kind = "format"\npattern = "(?=x)y"\n', r"bad regex"),
    ('kind = "format"\npattern = ""\n', r"pattern must be a non-empty regular expression"),
    ('kind = "format"\npattern = 3\n', r"pattern must be a non-empty regular expression"),
    ('kind = "format"\npattern = "x"\ndotall = "yes"\n', r"dotall must be true or false, got 'yes'"),
    ('kind = "format"\npattern = "x"\ndotall = 1\n', r"dotall must be true or false, got 1"),
    ('kind = "format"\ndotall = true\n', r"dotall needs a pattern"),
    ('kind = "format"\nenvs = "webshop"\n', r"envs must be a non-empty list of env names, got 'webshop'"),
    ('kind = "format"\nenvs = []\n', r"envs must be a non-empty list of env names, got \[\]"),
    ('kind = "format"\nenvs = ["webshop", ""]\n', r"envs must be a non-empty list of env names"),
    ('kind = "format"\nenvs = [1]\n', r"envs must be a non-empty list of env names"),
    ('kind = "format"\npattern = "x"\nover = "all"\n', r"over must be one of each, last"),
    ('kind = "sql"\nexpr = "num_turnz * 0.1"\n', r"num_turnz.*not valid over episodes columns"),
    ('kind = "sql"\nexpr = "step_reward"\n', r"step_reward.*not valid over episodes columns"),
    ('kind = "sql"\nexpr = "num_turns *"\n', r"not valid over episodes columns"),
    ('kind = "sql"\n', r"expr must be a non-empty SQL expression"),
    ('kind = "process"\nexpr = "step_rewardd > 0"\n', r"step_rewardd.*not valid over turns columns"),
    ('kind = "process"\nexpr = "success"\n', r"success.*not valid over turns columns"),
    ('kind = "process"\n', r"exactly one of signal"),
    ('kind = "process"\nsignal = "format_ok"\nexpr = "1"\n', r"exactly one of signal"),
    ('kind = "process"\nsignal = "valid"\n', r"unknown signal 'valid'"),
    ('kind = "process"\nsignal = "valid_action"\nunknown = "penalty"\n', r"unknown must be one of skip, false"),
    ('kind = "process"\nexpr = "1"\nunknown = "false"\n', r"unknown applies to a signal"),
    ('kind = "python"\nfunction = "no_such_module_trajlake:f"\n', r"cannot import no_such_module_trajlake:f"),
    ('kind = "python"\nfunction = "json:no_such_function"\n', r"cannot import json:no_such_function"),
    ('kind = "python"\nfunction = "math:pi"\n', r"math:pi is not callable"),
    ('kind = "python"\nfunction = "json.dumps"\n', r"function must be 'module:function'"),
    ('kind = "length_penalty"\n', r"needs max and/or min"),
    ('kind = "length_penalty"\nmax = -1\n', r"max must be a non-negative integer"),
    ('kind = "length_penalty"\nmax = 4\nshape = "cubic"\n', r"shape must be one of linear, quadratic, log"),
    ('kind = "env_reward"\ndiscount = 1.5\n', r"discount must be in \(0, 1\]"),
    ('kind = "goal"\nsuccess = "yes"\n', r"expected a finite number"),
    ('kind = "goal"\nsuccess = nan\n', r"expected a finite number"),
    ('kind = "goal"\nweight = "heavy"\n', r"weight must be a number"),
    ('kind = "goal"\nname = "has space"\n', r"must be an identifier"),
])
@pytest.mark.parametrize("nth", [1, 3])
def test_component_errors_name_file_and_line(tmp_path, body, expected, nth):
    line, msg, text = component_error(tmp_path, body, nth)
    assert line == line_of(text, "[[components]]", nth)
    assert msg.startswith(f"component {nth} (") or msg.startswith(f"component {nth}:")
    assert re.search(expected, msg), msg


def test_duplicate_names_name_the_second_one(tmp_path):
    text = ('name = "t"\n[[components]]\nkind = "goal"\nname = "a"\n\n'
            '[[components]]\nkind = "format"\npattern = "x"\nname = "a"\n')
    _, line, msg = error_of(tmp_path, text)
    assert line == line_of(text, "[[components]]", 2)
    assert "name 'a' is used twice" in msg


def test_duplicate_of_an_automatic_name_is_refused(tmp_path):
    # an unnamed goal is named "goal"; a second component explicitly named "goal" clashes with it
    text = 'name = "t"\n[[components]]\nkind = "goal"\n[[components]]\nkind = "format"\npattern = "x"\nname = "goal"\n'
    _, line, msg = error_of(tmp_path, text)
    assert line == 4 and "used twice" in msg


@pytest.mark.parametrize("alloc, expected", [
    ('strategy = "last"', r"unknown allocation strategy 'last'; valid: " + ", ".join(STRATEGIES)),
    ('strategy = "discounted"\ngamma = 0', r"gamma must be in \(0, 1\], got 0"),
    ('strategy = "discounted"\ngamma = 1.5', r"gamma must be in \(0, 1\], got 1.5"),
    ('strategy = "discounted"\ngamma = -0.5', r"gamma must be in \(0, 1\]"),
    ('strategy = "discounted"\ngamma = "0.9"', r"gamma must be in \(0, 1\]"),
    ('strategy = "discounted"\ndiscount = 0.9', r"unknown key\(s\) discount"),
])
def test_allocation_errors_name_file_and_line(tmp_path, alloc, expected):
    text = f'# header\nname = "t"\n\n[allocation]\n{alloc}\n\n[[components]]\nkind = "goal"\n'
    _, line, msg = error_of(tmp_path, text)
    assert line == 4
    assert re.search(expected, msg), msg


@pytest.mark.parametrize("text, line, expected", [
    # no name at all: the file's first line
    ('[[components]]\nkind = "goal"\n', 1, r"needs a `name`"),
    ('# comment\n\n[allocation]\nstrategy = "last_token"\n[[components]]\nkind = "goal"\n', 1, r"needs a `name`"),
    # a component's name is not the spec's
    ('# comment\n[[components]]\nkind = "goal"\nname = "outcome"\n', 1, r"needs a `name`"),
    # a name that is not a non-empty string: its own line
    ('# c\nname = ""\n[[components]]\nkind = "goal"\n', 2, r"needs a `name`"),
    ('# c\n\nname = 3\n[[components]]\nkind = "goal"\n', 3, r"needs a `name`"),
    # no components / an empty list of them
    ('name = "t"\n[allocation]\nstrategy = "last_token"\n', 1, r"at least one \[\[components\]\]"),
    ('name = "t"\n\ncomponents = []\n', 3, r"at least one \[\[components\]\]"),
    # unknown top-level keys
    ('name = "t"\nnmae = "u"\n[[components]]\nkind = "goal"\n', 2, r"unknown top-level key\(s\) nmae"),
    ('name = "t"\n[alocation]\nstrategy = "discounted"\n[[components]]\nkind = "goal"\n', 2,
     r"unknown top-level key\(s\) alocation"),
    # allocation not a table
    ('name = "t"\nallocation = "discounted"\n[[components]]\nkind = "goal"\n', 2, r"\[allocation\] must be a table"),
])
def test_whole_file_errors_name_file_and_line(tmp_path, text, line, expected):
    _, got, msg = error_of(tmp_path, text)
    assert got == line, msg
    assert re.search(expected, msg), msg


@pytest.mark.parametrize("text, line", [
    ('name = "t"\n[[components]]\nkind = goal\n', 3),            # unquoted string
    ('name = "t"\n\n[[components]]\nkind = "goal"\nweight = \n', 5),  # missing value
    ('name = "t"\nname = "u"\n[[components]]\nkind = "goal"\n', 2),  # key defined twice
    ('name = "t"\n[allocation\nstrategy = "x"\n', 2),            # unclosed table header
    ('name = "t\n', 1),                                          # unterminated string
])
def test_invalid_toml_names_file_and_line(tmp_path, text, line):
    _, got, msg = error_of(tmp_path, text)
    assert got == line, msg
    assert msg.startswith("not valid TOML")


def test_missing_file():
    with pytest.raises(SpecError, match=r"spec file .*no_such\.toml: no such file"):
        load_spec("no_such.toml")


def test_errors_come_before_any_work(tmp_path):
    """A bad spec fails in load_spec, before the CLI opens (and so creates) any lake."""
    from trajlake.cli import main

    path = write(tmp_path, EXAMPLE.replace("num_turns * 0.1", "no_such_column + 1"))
    assert main(["--lake", str(tmp_path / "never"), "rewards", "--spec", str(path)]) == 1
    assert not (tmp_path / "never").exists()


def test_component_kinds_are_one_registry():
    """A kind is one registration: a second one under a taken name is refused, an unknown name lists the kinds,
    and compile/score read what a kind does from its hooks, not its name."""
    from trajlake.core.registry import UnknownNameError
    from trajlake.rewards.components import KINDS, ComponentKind, get_kind, register

    with pytest.raises(ValueError, match="component kind 'goal' is already registered"):
        register(ComponentKind(kind="goal", doc="", defaults={}, check=lambda p: None, turn_columns=lambda n, p: {},
                               aggregates=lambda n, p: {}, value=lambda n, p: "0"))
    with pytest.raises(UnknownNameError, match="unknown component kind 'gaol'; valid names: .*goal"):
        get_kind("gaol")
    assert [k for k in KINDS.names() if get_kind(k).per_turn] == ["process"]
    assert [k for k in KINDS.names() if get_kind(k).compute is not None] == ["python"]
    with pytest.raises(TypeError):  # keyword fields only: a kind says what each function is
        ComponentKind("x", "doc", {}, None, None, None, None)
