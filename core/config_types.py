"""Type checks of config dataclasses from their annotations, so a wrong type is an error naming the field.

A TOML config or a keyword argument can hand a field any value (`lr = "fast"`); without a check the first
comparison with it fails far from the cause (`'>' not supported between instances of 'str' and 'int'`).
`check_field_types(config, ...)` runs first in `__post_init__` and says which field wants which type.
"""

from __future__ import annotations

import dataclasses
import numbers
import types
import typing
from typing import Any

from trajlake.core.errors import TrajlakeError

_NAMES = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}


def check_field_types(config: Any, prefix: str, error: type[TrajlakeError] = TrajlakeError) -> None:
    """Raise `error("<prefix>: <field> must be <type>, got <value>")` for the first field of the dataclass
    `config` whose value does not fit its annotation. An integer given for a float field becomes that float
    (TOML reads `lr = 1` as an integer), and a list given for a tuple field becomes a tuple, so the stored
    config reads back the same whichever was written."""
    hints = typing.get_type_hints(type(config))
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        ok, fixed = _conform(value, hints[f.name])
        if not ok:
            raise error(f"{prefix}: {f.name} must be {_describe(hints[f.name])}, got {value!r} "
                        f"({type(value).__name__})")
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
    """Each dataclass field's docstring (the string literal after it in the class body), from `cls` and its
    bases: the one text that documents a field, shown as the CLI's help too."""
    import ast
    import inspect
    import textwrap

    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(klass):
            continue
        body = ast.parse(textwrap.dedent(inspect.getsource(klass))).body[0].body
        for node, nxt in zip(body, body[1:] + [None], strict=True):
            if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and isinstance(nxt, ast.Expr)
                    and isinstance(nxt.value, ast.Constant) and isinstance(nxt.value.value, str)):
                docs[node.target.id] = " ".join(nxt.value.value.split())
    return docs
