"""CLI options made from a config dataclass's fields: RolloutConfig's fields become `--kebab-case` options of
`collect` and `evaluate`, with the field's default and its docstring as the help, so a rollout setting is
declared, defaulted and documented once (collect/config.py) however many commands take it."""

from __future__ import annotations

import dataclasses
import functools
import inspect
import typing
from collections.abc import Callable
from typing import Any

import typer

from trajlake.collect.config import ROLLOUT_FIELDS
from trajlake.core.config_types import field_docs


def rollout_options(config_cls: type, *, required: tuple[str, ...] = ()) -> Callable[[Callable], Callable]:
    """Decorator for a typer command `fn(..., rollout: dict)`: the command gets one option per RolloutConfig
    field (defaults as `config_cls` declares them, `required` ones without a default), and `fn` receives
    their values as the `rollout` dict, ready for `config_cls(**rollout, ...)`."""
    hints = typing.get_type_hints(config_cls)
    docs = field_docs(config_cls)
    fields = {f.name: f for f in dataclasses.fields(config_cls)}

    def option(name: str) -> inspect.Parameter:
        f = fields[name]
        default = ... if name in required else f.default
        help_text = docs.get(name, "")
        opt = typer.Option(default, "--" + name.replace("_", "-"), help=help_text, show_default=default is not None)
        return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=opt, annotation=hints[name])

    def deco(fn: Callable) -> Callable:
        own_hints = typing.get_type_hints(fn)  # resolved where fn was written (its annotations may be strings)
        own = [p.replace(annotation=own_hints.get(p.name, p.annotation))
               for p in inspect.signature(fn).parameters.values() if p.name != "rollout"]
        clash = {p.name for p in own} & set(ROLLOUT_FIELDS)
        if clash:
            raise TypeError(f"{fn.__name__} declares rollout options itself: {sorted(clash)}")

        @functools.wraps(fn)
        def command(**kwargs: Any) -> Any:
            rollout = {name: kwargs.pop(name) for name in ROLLOUT_FIELDS}
            return fn(rollout=rollout, **kwargs)

        params = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in own] + [option(n) for n in ROLLOUT_FIELDS]
        command.__signature__ = inspect.Signature(params)
        command.__annotations__ = {p.name: p.annotation for p in params}
        del command.__wrapped__  # typer must read the signature above, not fn's
        return command

    return deco


__all__ = ["rollout_options"]
