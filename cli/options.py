"""CLI options made from config dataclass fields, so a setting is declared, defaulted and documented once (in
its config class) however many commands take it:

- `rollout_options`: RolloutConfig's fields as `--kebab-case` options of `collect` and `evaluate`, with the
  field's default and its `help` (core/config_types.py) as the help;
- `override_options`: every TrainConfig field (train/overrides.py) as an option of `train` by its dotted and
  its flat name, listed under its section, each None unless given (the config file's value stands).

Both splice the options into a typer command's signature and hand the command their values as one dict.
"""

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
from trajlake.train.overrides import Override, given_overrides, option_name, override_specs

#: the help panels `train --help` lists the overrides under, one a section: "Config overrides: kl"
OVERRIDES_PANEL = "Config overrides"


def rollout_options(config_cls: type, *, required: tuple[str, ...] = ()) -> Callable[[Callable], Callable]:
    """Decorator for a typer command `fn(..., rollout: dict)`: the command gets one option per RolloutConfig
    field (defaults as `config_cls` declares them, `required` ones without a default), and `fn` receives
    their values as the `rollout` dict, ready for `config_cls(**rollout, ...)`."""
    hints = typing.get_type_hints(config_cls)
    docs = field_docs(config_cls)
    fields = {f.name: f for f in dataclasses.fields(config_cls)}

    def option(name: str) -> inspect.Parameter:
        default = ... if name in required else fields[name].default
        opt = typer.Option(default, option_name(name), help=docs.get(name, ""), show_default=default is not None)
        return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=opt, annotation=hints[name])

    return _spliced([option(n) for n in ROLLOUT_FIELDS], into="rollout")


def override_options() -> Callable[[Callable], Callable]:
    """Decorator for a typer command `fn(..., overrides: dict)`: one option per TrainConfig field (None
    unless given; a tuple field's option repeats, a bool is `--x/--no-x`), and `fn` receives the ones given
    as the `overrides` dict, ready for `load_config(path, **overrides)`."""

    def option(o: Override) -> inspect.Parameter:
        annotation = (list[o.type] if o.repeated else o.type) | None
        flags = [f"{name}/--no-{name[2:]}" if o.type is bool else name for name in (o.option, o.dotted)]
        opt = typer.Option(None, *flags, help=o.help, show_default=False,
                           rich_help_panel=f"{OVERRIDES_PANEL}: {o.section}")
        return inspect.Parameter(o.field, inspect.Parameter.KEYWORD_ONLY, default=opt, annotation=annotation)

    return _spliced([option(o) for o in override_specs()], into="overrides", finish=given_overrides)


def _spliced(options: list[inspect.Parameter], *, into: str,
             finish: Callable[[dict[str, Any]], dict[str, Any]] = dict) -> Callable[[Callable], Callable]:
    """Decorator: `fn(..., <into>: dict)` becomes a command taking fn's own parameters and `options`; fn gets the
    options' values as the dict `<into>` (through `finish`)."""
    names = [p.name for p in options]

    def deco(fn: Callable) -> Callable:
        own_hints = typing.get_type_hints(fn)  # resolved where fn was written (its annotations may be strings)
        own = [p.replace(annotation=own_hints.get(p.name, p.annotation))
               for p in inspect.signature(fn).parameters.values() if p.name != into]
        clash = {p.name for p in own} & set(names)
        if clash:
            raise TypeError(f"{fn.__name__} declares options that its config fields make: {sorted(clash)}")

        @functools.wraps(fn)
        def command(**kwargs: Any) -> Any:
            values = finish({name: kwargs.pop(name) for name in names})
            return fn(**{into: values}, **kwargs)

        params = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in own] + options
        command.__signature__ = inspect.Signature(params)
        command.__annotations__ = {p.name: p.annotation for p in params}
        del command.__wrapped__  # typer must read the signature above, not fn's
        return command

    return deco


__all__ = ["rollout_options", "override_options"]
