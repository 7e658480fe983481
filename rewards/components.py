"""The registry of reward component kinds: every built-in kind (one module each in `rewards/kinds/`) is imported
here by name and registered, so importing this module always yields every kind; a user's kind is one more
`register(ComponentKind(...))`. compile.py and score.py ask a kind's hooks, never its name.
"""

from __future__ import annotations

from typing import Any

from trajlake.core.config_types import at_old_value
from trajlake.core.errors import TrajlakeError
from trajlake.core.registry import Registry
from trajlake.rewards.component_kind import ComponentKind
from trajlake.rewards.kinds.env_reward import ENV_REWARD
from trajlake.rewards.kinds.format import FORMAT
from trajlake.rewards.kinds.goal import GOAL
from trajlake.rewards.kinds.length_penalty import LENGTH_PENALTY
from trajlake.rewards.kinds.process import PROCESS
from trajlake.rewards.kinds.python import PYTHON
from trajlake.rewards.kinds.sql import SQL

#: the kinds trajlake ships
BUILTIN_KINDS: tuple[ComponentKind, ...] = (GOAL, LENGTH_PENALTY, FORMAT, ENV_REWARD, PROCESS, SQL, PYTHON)


def _registry(entries: tuple[ComponentKind, ...]) -> Registry[ComponentKind]:
    registry: Registry[ComponentKind] = Registry("component kind")
    for kind in entries:
        registry.add(kind.kind, kind)
    return registry


#: every component kind, by name (a duplicate is refused; an unknown name lists the valid ones)
KINDS: Registry[ComponentKind] = _registry(BUILTIN_KINDS)


def register(kind: ComponentKind) -> ComponentKind:
    """Add a kind (a user's own) under its name; a taken name is refused."""
    return KINDS.add(kind.kind, kind)


def kinds() -> list[str]:
    return KINDS.names()


def get_kind(kind: str | None) -> ComponentKind:
    return KINDS[kind]


def validate_component(kind: str | None, params: dict[str, Any]) -> dict[str, Any]:
    """Fill defaults, refuse unknown keys, and run the kind's checks; returns the normalised params."""
    k = get_kind(kind)
    unknown = set(params) - set(k.defaults)
    if unknown:
        raise TrajlakeError(f"unknown parameter(s) {', '.join(sorted(unknown))}; "
                            f"{kind} takes {', '.join(sorted(k.defaults)) or 'none'}")
    full = {**k.defaults, **params}
    k.check(full)
    return full


def normalised_params(kind: str, params: dict[str, Any]) -> dict[str, Any]:
    """The params a spec id hashes: all of them, less added ones left at the value that keeps the old meaning."""
    before = get_kind(kind).added_later
    return {k: v for k, v in params.items() if not (k in before and at_old_value(v, before[k]))}


__all__ = ["BUILTIN_KINDS", "KINDS", "ComponentKind", "get_kind", "kinds", "normalised_params", "register",
           "validate_component"]
