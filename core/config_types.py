"""Config dataclasses: type checks from their annotations, and what each field is to a run.

A TOML config or a keyword argument can hand a field any value (`lr = "fast"`); without a check the first
comparison with it fails far from the cause (`'>' not supported between instances of 'str' and 'int'`).
`check_field_types(config, ...)` runs first in `__post_init__` and says which field wants which type.

What a field is to a run is declared on the field itself, once, for every stage (collect, train, evaluate):
every field identifies the run (a resumed run must give it the stored value; an id hashed from the settings
holds it) unless it is declared `operational(...)`: how the run is carried out or reported, which a resume may
change and an id leaves out. A field declared `added_later(default)` identifies the run too, but was added after
runs were stored: those runs were made at `default`, so a stored config without it compares as `default` and an
id made from the settings leaves it out at `default` (the ids made before it stay the same). Any other field of
a config is declared `setting(...)`.

Each of the three takes the field's `help=`, its one documentation, kept in the field's metadata (HELP) as TRL's
HfArgumentParser keeps it: `field_docs(cls)` reads it back, and the CLI shows it as the option's help.

A config may be nested in sections, as verl's is (TrainConfig: `cfg.kl.coef`): a field declared `section(Cls)` holds
a dataclass of fields of one concern, and its fields are the config's leaves. Every function here that reads a
config's fields reads its leaves (`leaf_fields`, `leaf_values`), each by its flat name: the section class's
`flat_names` entry (`coef` in KLSection is `kl_coef`), else the field's own name. Flat names are unique in a
config; they key a run's stored config, so stored configs read the same whether or not a config has sections.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import numbers
import types
import typing
from typing import Any

from trajlake.core.errors import TrajlakeError

#: the metadata key `operational` sets on a field
OPERATIONAL = "operational"
#: the metadata key `added_later` sets on a field: the value the runs stored before the field existed were made at
BEFORE = "before"
#: the metadata key of a field's help (`setting`, `operational` and `added_later` set it; `field_docs` reads it)
HELP = "help"

_NAMES = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}
#: the key of a stored run config holding the defaults of the code that wrote it (`stored_defaults`), so a reader
#: (the viewer's config table) tells what a run changed without importing that code, whose defaults may have
#: moved since
DEFAULTS_KEY = "config_defaults"
#: a field's entry in `stored_defaults` when it has no default (`model`)
REQUIRED = "(required)"
#: the metadata key `section` sets on a field holding a section (a dataclass of fields of one concern)
SECTION = "section"


def section(cls: type, *, help: str) -> Any:
    """A dataclass field holding a section: an instance of the dataclass `cls` (made with its defaults when not
    given), whose fields are the config's leaves. `help` says what the section holds."""
    return dataclasses.field(default_factory=cls, metadata={SECTION: cls, HELP: help})


def flat_name(cls: type, name: str) -> str:
    """The flat name of field `name` of the dataclass `cls` (a section's `flat_names` entry, else `name`)."""
    return getattr(cls, "flat_names", {}).get(name, name)


def leaf_fields(cls: type) -> list[tuple[str, tuple[str, ...], dataclasses.Field]]:
    """(flat name, attribute path, field) of each leaf of the dataclass `cls` in declaration order: its own
    fields, and the fields of each section field (declared `section(...)`) in its place."""
    out = []
    for f in dataclasses.fields(cls):
        inner = f.metadata.get(SECTION)
        if inner is None:
            out.append((flat_name(cls, f.name), (f.name,), f))
        else:
            out.extend((flat_name(inner, g.name), (f.name, g.name), g) for g in dataclasses.fields(inner))
    return out


def leaf_values(config: Any) -> dict[str, Any]:
    """{flat name: value} of each leaf of the dataclass instance `config` (a section it leaves out, None, has
    none), values copied as `dataclasses.asdict` copies them."""
    out = {}
    for name, path, _ in leaf_fields(type(config)):
        holder = config if len(path) == 1 else getattr(config, path[0])
        if holder is not None:
            out[name] = copy.deepcopy(getattr(holder, path[-1]))
    return out


def check_field_types(config: Any, prefix: str, error: type[TrajlakeError] = TrajlakeError) -> None:
    """Raise `error("<prefix>: <field> must be <type>, got <value>")` (the field by its flat name) for the first
    field of the dataclass `config` whose value does not fit its annotation. An integer given for a float field
    becomes that float (TOML reads `lr = 1` as an integer), and a list given for a tuple field becomes a tuple, so the
    stored
    config reads back the same whichever was written."""
    hints = typing.get_type_hints(type(config))
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        ok, fixed = _conform(value, hints[f.name])
        if not ok:
            raise error(f"{prefix}: {flat_name(type(config), f.name)} must be {_describe(hints[f.name])}, got "
                        f"{value!r} ({type(value).__name__})")
        if fixed is not value:
            object.__setattr__(config, f.name, fixed)  # frozen dataclasses too: this is construction


def _conform(value: Any, hint: Any) -> tuple[bool, Any]:
    """(whether `value` fits `hint`, the value to keep)."""
    if hint is Any:
        return True, value
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (types.UnionType, typing.Union):
        for arg in args:
            ok, fixed = _conform(value, arg)
            if ok:
                return True, fixed
        return False, value
    if hint is type(None):
        return value is None, value
    if hint is bool:
        return isinstance(value, bool), value
    if hint is int:  # bool is an int to Python, never to a user: `tasks = true` is a mistake
        ok = isinstance(value, numbers.Integral) and not isinstance(value, bool)
        return ok, int(value) if ok and type(value) is not int else value
    if hint is float:
        ok = isinstance(value, numbers.Real) and not isinstance(value, bool)
        return ok, float(value) if ok and type(value) is not float else value
    if origin is tuple:
        if not isinstance(value, (tuple, list)):
            return False, value
        item = args[0] if len(args) == 2 and args[1] is Ellipsis else Any
        kept = []
        for v in value:
            ok, fixed = _conform(v, item)
            if not ok:
                return False, value
            kept.append(fixed)
        return True, tuple(kept)
    return isinstance(value, origin or hint), value


def _describe(hint: Any) -> str:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (types.UnionType, typing.Union):
        named = [_describe(a) for a in args if a is not type(None)]
        return " or ".join(named) + (" (or left unset)" if type(None) in args else "")
    if origin is tuple:
        item = args[0] if len(args) == 2 and args[1] is Ellipsis else None
        return f"a list of {_plural(item)}" if item is not None else "a list"
    if origin is dict or hint is dict:
        return "a table (mapping)"
    return _NAMES.get(hint, getattr(hint, "__name__", str(hint)))


def _plural(hint: Any) -> str:
    return {int: "integers", float: "numbers", str: "strings", bool: "booleans"}.get(hint, _describe(hint))


def field_docs(cls: type) -> dict[str, str]:
    """Each leaf of the dataclass `cls` (its bases' too), by flat name -> its help (HELP in the field's metadata,
    whitespace runs joined): the one text that documents a field, shown as the CLI's help too. A field declared
    without help is left out."""
    return {name: " ".join(f.metadata[HELP].split()) for name, _, f in leaf_fields(cls) if f.metadata.get(HELP)}


def setting(default: Any = dataclasses.MISSING, *, help: str, default_factory: Any = dataclasses.MISSING) -> Any:
    """A dataclass field that identifies a run (neither `operational` nor `added_later`), documented by `help`."""
    return dataclasses.field(default=default, default_factory=default_factory, metadata={HELP: help})


def operational(default: Any = dataclasses.MISSING, *, help: str, default_factory: Any = dataclasses.MISSING) -> Any:
    """A dataclass field that says how a run is carried out or reported, not what the run is: a resumed run may
    give it another value, and a run id hashed from the settings leaves it out. `help` documents it."""
    return dataclasses.field(default=default, default_factory=default_factory,
                             metadata={OPERATIONAL: True, HELP: help})


def added_later(default: Any, *, help: str, before: Any = dataclasses.MISSING) -> Any:
    """A dataclass field that identifies a run but was added after runs were stored, all of them made at
    `before` (the value that keeps the old meaning; `default` when not given, i.e. the new field's default keeps
    the old behaviour): a stored config that lacks it compares as `before`, and a run id hashed from the settings
    leaves it out while it is `before`. `help` documents it."""
    old = default if before is dataclasses.MISSING else before
    return dataclasses.field(default=default, metadata={BEFORE: old, HELP: help})


def run_fields(cls: type, order: tuple[str, ...] = ()) -> tuple[str, ...]:
    """The fields of the dataclass `cls` that identify a run (every field not declared `operational`): those
    named in `order` first, in that order, then the others in declaration order."""
    rank = {name: i for i, name in enumerate(order)}
    names = [name for name, _, f in leaf_fields(cls) if not f.metadata.get(OPERATIONAL)]
    return tuple(sorted(names, key=lambda name: rank.get(name, len(rank))))


def operational_fields(cls: type) -> tuple[str, ...]:
    """The fields of the dataclass `cls` declared `operational`, in declaration order."""
    return tuple(name for name, _, f in leaf_fields(cls) if f.metadata.get(OPERATIONAL))


def added_fields(cls: type) -> dict[str, Any]:
    """{field: the value runs stored before it were made at} for the fields of `cls` declared `added_later`."""
    return {name: f.metadata[BEFORE] for name, _, f in leaf_fields(cls) if BEFORE in f.metadata}


def at_old_value(value: Any, before: Any) -> bool:
    """Whether `value` is the value `before` a field was added (of the same type: True is not 1)."""
    return value == before and type(value) is type(before)


def id_settings(config: Any, leave_out: tuple[str, ...] = ()) -> dict[str, Any]:
    """The settings a run id made from the dataclass `config` hashes: its run-identifying fields but
    `leave_out`, less the `added_later` ones still at the value the older ids were made at."""
    before = added_fields(type(config))
    values = leaf_values(config)
    return {name: values[name] for name in run_fields(type(config))
            if name not in leave_out and not (name in before and at_old_value(values[name], before[name]))}


def stored_defaults(cls: type) -> dict[str, Any]:
    """Each leaf of the dataclass `cls`, by flat name -> its default as a stored config holds it (JSON: tuples as
    lists), REQUIRED for a field without one."""
    out: dict[str, Any] = {}
    for name, _, f in leaf_fields(cls):
        if f.default is not dataclasses.MISSING:
            out[name] = json.loads(json.dumps(f.default))
        elif f.default_factory is not dataclasses.MISSING:
            out[name] = json.loads(json.dumps(f.default_factory()))
        else:
            out[name] = REQUIRED
    return out
