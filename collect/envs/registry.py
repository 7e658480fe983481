"""The env registry: `register_env(cls)` (or `@register_env` on an `Env` subclass) makes it available to
`make_env(name)`. The package (collect/envs/__init__.py) registers the built-ins by name, explicitly."""

from __future__ import annotations

from typing import Any

from trajlake.collect.envs.base import SPLITS, Env
from trajlake.core.registry import Registry

#: every env class, by its `name`
ENVS: Registry[type[Env]] = Registry("env")


def register_env(cls: type[Env]) -> type[Env]:
    """Class decorator: register `cls` under `cls.name`. A second, different class under one name is an error."""
    if not cls.name:
        raise ValueError(f"{cls.__qualname__} has no `name`")
    old = ENVS.get(cls.name)
    if old is not None:  # the same class again (a module imported twice) is harmless; a clash of names is not
        if old.__qualname__ != cls.__qualname__:
            raise ValueError(f"env name {cls.name!r} is taken by {old.__module__}.{old.__qualname__}")
        return old
    return ENVS.add(cls.name, cls)


def env_names() -> list[str]:
    """The registered env names, sorted."""
    return ENVS.names()


def env_class(name: str) -> type[Env]:
    """The class registered as `name`; KeyError listing the valid names."""
    cls = ENVS.get(name)
    if cls is None:
        raise KeyError(f"unknown env {name!r}; valid envs: {', '.join(env_names())}")
    return cls


def make_env(name: str, **kwargs: Any) -> Env:
    """A new, independent instance of the env registered as `name` (kwargs go to its constructor)."""
    return env_class(name)(**kwargs)


def env_info() -> list[dict[str, Any]]:
    """One row per registered env (name, description, actions, remote, splits, difficulties, step limits, and a
    server env's split sizes, split scheme and difficulty per split)."""
    rows = []
    for name in env_names():
        cls = ENVS[name]
        rows.append({"name": name, "description": cls.description, "actions": cls.action_help,
                     "remote": bool(getattr(cls, "remote", False)),
                     "splits": list(getattr(cls, "splits", SPLITS)), "difficulties": sorted(cls.max_steps),
                     "max_steps": dict(sorted(cls.max_steps.items())),
                     "split_sizes": dict(getattr(cls, "split_sizes", {})),
                     "split_scheme": getattr(cls, "split_scheme", ""),
                     "split_difficulty": dict(getattr(cls, "split_difficulty", {}))})
    return rows
