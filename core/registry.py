"""The one registry style: named entries, filled by a decorator or `add` (and emptied by `unregister`),
duplicates refused, and an unknown name answered with the valid ones.

Every extension point of trajlake is a `Registry`: training algorithms, advantage estimators, policy and
value losses, KL penalties, aggregation modes (train.algos), envs (collect.envs), policy schemes
(collect.policies), reward component kinds (rewards.components) and catalog backends (store.uri). Adding one
is one registration.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

from trajlake.core.errors import TrajlakeError

T = TypeVar("T")


class UnknownNameError(TrajlakeError, KeyError, ValueError):
    """An unknown name was asked of a registry; the message lists the valid names."""

    def __str__(self) -> str:  # KeyError would print the repr of the message
        return str(self.args[0]) if self.args else ""


class Registry(Generic[T]):
    """Entries of one kind (`kind` names it in errors) keyed by name; aliases share an entry.

    ``registry[name]`` raises :class:`UnknownNameError` listing the valid names; registering a taken name
    raises ValueError (a programming error: two entries cannot share a name)."""

    def __init__(self, kind: str):
        self.kind = kind
        self._entries: dict[str, T] = {}

    def register(self, name: str, *aliases: str) -> Callable[[T], T]:
        """Decorator: register the function (or class) under ``name`` and any ``aliases``."""

        def deco(entry: T) -> T:
            self.add(name, entry, *aliases)
            return entry

        return deco

    def add(self, name: str, entry: T, *aliases: str) -> T:
        """Register ``entry`` under ``name`` and any ``aliases``; a name already taken is refused."""
        for n in (name, *aliases):
            if n in self._entries:
                raise ValueError(f"{self.kind} {n!r} is already registered")
        for n in (name, *aliases):
            self._entries[n] = entry
        return entry

    def unregister(self, name: str) -> T:
        """Remove the entry registered under ``name`` with every alias of it, and return it (a test or a
        notebook that registered one for a while takes it out again); an unknown name raises
        :class:`UnknownNameError`."""
        entry = self[name]
        for n in [n for n, e in self._entries.items() if e is entry]:
            del self._entries[n]
        return entry

    def __getitem__(self, name: str) -> T:
        try:
            return self._entries[name]
        except (KeyError, TypeError):
            raise UnknownNameError(f"unknown {self.kind} {name!r}; valid names: {', '.join(self.names())}") from None

    def get(self, name: str, default: T | None = None) -> T | None:
        return self._entries.get(name, default)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def items(self):
        return self._entries.items()

    def names(self) -> list[str]:
        """The registered names (aliases included), sorted."""
        return sorted(self._entries)


__all__ = ["Registry", "UnknownNameError"]
