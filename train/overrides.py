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

#: the types one value on a command line parses as
_SCALARS = (str, int, float, bool)


def override_fields() -> tuple[str, ...]:
    """The overridable fields, by flat name: every leaf of TrainConfig, section by section."""
    from trajlake.train.config import LEAVES  # here, not at import: the module imports torch

    return tuple(LEAVES)


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
    """Every TrainConfig leaf as an option, from its annotation and help, section by section (in TrainConfig's
    order; in declaration order within one)."""
    from trajlake.core.config_types import field_docs, leaf_fields
    from trajlake.train.config import SECTIONS, TrainConfig  # here, not at import: the module imports torch

    docs = field_docs(TrainConfig)
    hints = {key: typing.get_type_hints(cls) for key, cls in SECTIONS.items()}
    out = []
    for name, (key, short), _ in leaf_fields(TrainConfig):
        value_type, repeated = _option_type(name, hints[key][short])
        out.append(Override(field=name, option=option_name(name), dotted=dotted_option(name), section=key,
                            type=value_type, repeated=repeated, help=docs[name]))
    return out


def option_name(field: str) -> str:
    """The command-line option of a config field: `run_id` is `--run-id`."""
    return "--" + field.replace("_", "-")


def dotted_option(field: str) -> str:
    """The command-line option of a config field by its dotted name: `kl_coef` is `--kl.coef`,
    `lr_warmup_steps` is `--optim.lr-warmup-steps`."""
    from trajlake.train.config import dotted

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
