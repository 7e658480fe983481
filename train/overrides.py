"""Every TrainConfig field is a command-line override, declared once (as the field): `trajlake train`
(cli/train.py) and `python -m trajlake.train` (train/__main__.py) both make one option per field, in
declaration order, typed by the field's annotation (a bool is `--x/--no-x`, a tuple field's option repeats) and
helped by its `help=` (kept in the field's metadata), as TRL's HfArgumentParser does. Each option has two
spellings: the field's dotted name in its section (`--kl.coef`, train/config_sections.py, as verl's overrides
read) and its flat name (`--kl-coef`). An option given replaces the config file's value
(`load_config(path, **values)`); one left out keeps it.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any

from trajlake.train.config_sections import SECTION_OF, SECTIONS, dotted

#: the types one value on a command line parses as
_SCALARS = (str, int, float, bool)


def override_fields() -> tuple[str, ...]:
    """The overridable fields: every TrainConfig field, in declaration order."""
    from trajlake.train.config import TrainConfig  # here, not at import: the module imports torch

    return tuple(f.name for f in dataclasses.fields(TrainConfig))


@dataclasses.dataclass(frozen=True)
class Override:
    """One overridable field as a command-line option."""

    field: str
    """The TrainConfig field, e.g. `run_id`."""
    option: str
    """Its option, e.g. `--run-id`."""
    dotted: str
    """The same option by the field's dotted name in its section, e.g. `--run.id`."""
    section: str
    """Its section (train/config_sections.py), e.g. `run`."""
    type: type
    """What one value parses as: str, int, float, or bool (a `--x/--no-x` flag)."""
    repeated: bool
    """A tuple field: the option is given once per item (`--report-to a --report-to b`)."""
    help: str
    """The field's help (`field_docs`)."""


def override_specs() -> list[Override]:
    """Every TrainConfig field as an option, from its annotation and help, section by section (in SECTIONS'
    order; in declaration order within one)."""
    from trajlake.core.config_types import field_docs
    from trajlake.train.config import TrainConfig  # here, not at import: the module imports torch

    hints = typing.get_type_hints(TrainConfig)
    docs = field_docs(TrainConfig)
    out = []
    for name in sorted(override_fields(), key=lambda f: list(SECTIONS).index(SECTION_OF[f])):
        value_type, repeated = _option_type(name, hints[name])
        out.append(Override(field=name, option=option_name(name), dotted=dotted_option(name),
                            section=SECTION_OF[name], type=value_type, repeated=repeated, help=docs[name]))
    return out


def option_name(field: str) -> str:
    """The command-line option of a config field: `run_id` is `--run-id`."""
    return "--" + field.replace("_", "-")


def dotted_option(field: str) -> str:
    """The command-line option of a config field by its dotted name: `kl_coef` is `--kl.coef`,
    `lr_warmup_steps` is `--optim.lr-warmup-steps`."""
    section, short = dotted(field).split(".", 1)
    return f"--{section}.{short.replace('_', '-')}"


def given_overrides(values: dict[str, Any]) -> dict[str, Any]:
    """The overrides a command line gave, by field: an option left out (None) or a repeated one never given
    (an empty list, which would replace the config's list with nothing) is dropped."""
    return {name: value for name, value in values.items() if value is not None and value != []}


def _option_type(name: str, hint: Any) -> tuple[type, bool]:
    """(the type one value parses as, whether the option repeats) for a field annotated `hint`: `X | None`
    is X (an option left out is None anyway), `tuple[X, ...]` is X repeated."""
    if typing.get_origin(hint) in (types.UnionType, typing.Union):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        hint = args[0] if len(args) == 1 else hint
    repeated = typing.get_origin(hint) is tuple
    if repeated:
        args = typing.get_args(hint)
        hint = args[0] if len(args) == 2 and args[1] is Ellipsis else hint
    if hint not in _SCALARS:  # a field the command line cannot spell (a mapping needs a file)
        raise TypeError(f"TrainConfig.{name} ({hint}) cannot be a command-line override")
    return hint, repeated


__all__ = ["Override", "override_fields", "override_specs", "option_name", "dotted_option", "given_overrides"]
