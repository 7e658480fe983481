"""Reward specs: a TOML file naming weighted components and an allocation strategy.

    name = "goal-and-turns"
    [allocation]
    strategy = "discounted"   # last_token | uniform_positive | discounted | per_turn
    gamma = 0.9
    [[components]]
    kind = "goal"
    weight = 1.0

Everything is checked at load time, before any work starts; an error names the file and the line of the
offending component. A spec's id is the hash of its normalised content (defaults filled in, comments and
formatting ignored), so the same reward function always has the same id.
"""

from __future__ import annotations

import hashlib
import json
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trajlake.core.errors import TrajlakeError
from trajlake.core.text_files import read_text_file
from trajlake.schemas.allocations import ALLOCATIONS

#: the allocation strategies a spec may name, as registered (schemas/allocations.py), in registration order
STRATEGIES = tuple(ALLOCATIONS)


class SpecError(TrajlakeError):
    """A reward spec is invalid; the message names the file and line."""


@dataclass(frozen=True)
class Allocation:
    """How an episode's total reward is spread over its agent tokens."""

    strategy: str = "last_token"
    gamma: float = 1.0


@dataclass(frozen=True)
class Component:
    """One weighted term of the reward: `kind` selects its definition, `params` its settings."""

    kind: str
    name: str
    weight: float
    params: dict[str, Any] = field(default_factory=dict)
    line: int = 0  # where it starts in the spec file, for error messages


@dataclass(frozen=True)
class RewardSpec:
    name: str
    components: tuple[Component, ...]
    allocation: Allocation
    source: str = "<spec>"

    def to_json(self) -> dict[str, Any]:
        """The normalised content (what the id hashes and what reward_specs stores)."""
        from trajlake.rewards.components import normalised_params
        return {
            "name": self.name,
            "allocation": {"strategy": self.allocation.strategy, "gamma": self.allocation.gamma},
            "components": [{"kind": c.kind, "name": c.name, "weight": c.weight, **normalised_params(c.kind, c.params)}
                           for c in self.components],
        }

    @property
    def spec_id(self) -> str:
        canonical = json.dumps(self.to_json(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()[:16]

    def component(self, name: str) -> Component:
        return next(c for c in self.components if c.name == name)


def load_spec(path: str | Path) -> RewardSpec:
    """Read and validate a spec file."""
    return parse_spec(read_text_file(path, "spec file", error=SpecError), source=str(path))


def parse_spec(text: str, source: str = "<spec>") -> RewardSpec:
    """Validate a spec's TOML text; `source` names it in errors."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        at = re.search(r"\(at line (\d+), column \d+\)", str(e))  # Python < 3.14 has no e.lineno
        raise SpecError(f"{source}:{at.group(1) if at else 1}: not valid TOML: {e}") from None
    except RecursionError:  # tomllib parses nested arrays and tables recursively
        raise SpecError(f"{source}: not a spec: its values nest too deep for TOML's reader") from None

    def fail(msg: str, line: int = 0) -> SpecError:
        # errors about the whole file point at its first line
        return SpecError(f"{source}:{line or 1}: {msg}")

    unknown = set(data) - {"name", "allocation", "components", "description"}
    if unknown:
        raise fail(f"unknown top-level key(s) {', '.join(sorted(unknown))}; keys are name, allocation, components",
                   min(filter(None, (_key_line(text, k) for k in unknown)), default=0))
    name = data.get("name")
    if not isinstance(name, str) or not name:
        raise fail("a spec needs a `name` (a non-empty string)", _key_line(text, "name"))
    allocation = _allocation(data.get("allocation", {}), text, fail)
    raw = data.get("components")
    if not isinstance(raw, list) or not raw:
        raise fail("a spec needs at least one [[components]] entry", _key_line(text, "components"))
    lines = _component_lines(text)
    components: list[Component] = []
    seen: set[str] = set()
    for i, entry in enumerate(raw):
        components.append(_component(i, dict(entry), lines[i] if i < len(lines) else 0, seen, fail))
    return RewardSpec(name, tuple(components), allocation, source)


def _allocation(alloc: Any, text: str, fail) -> Allocation:
    """The [allocation] table, checked: a known strategy, gamma in (0, 1]."""
    if not isinstance(alloc, dict):
        raise fail("[allocation] must be a table", _key_line(text, "allocation"))
    extra = set(alloc) - {"strategy", "gamma"}
    if extra:
        raise fail(f"[allocation]: unknown key(s) {', '.join(sorted(extra))}", _line_of(text, "[allocation]"))
    strategy = alloc.get("strategy", "last_token")
    if strategy not in ALLOCATIONS:
        raise fail(f"unknown allocation strategy {strategy!r}; valid: {', '.join(ALLOCATIONS)}",
                   _line_of(text, "[allocation]"))
    gamma = alloc.get("gamma", 1.0)
    if not isinstance(gamma, (int, float)) or not 0 < gamma <= 1:
        raise fail(f"allocation gamma must be in (0, 1], got {gamma!r}", _line_of(text, "[allocation]"))
    return Allocation(strategy, float(gamma))


def _component(i: int, entry: dict, line: int, seen: set[str], fail) -> Component:
    """The i-th [[components]] entry (at `line`), checked: its kind, weight, a name not in `seen` (added to it),
    and its kind's own parameters."""
    from trajlake.rewards.components import kinds, validate_component

    kind = entry.pop("kind", None)
    weight = entry.pop("weight", 1.0)
    explicit = entry.pop("name", None)
    cname = explicit or kind
    if not isinstance(kind, str):
        raise fail(f"component {i + 1}: needs a `kind` (one of {', '.join(kinds())}), got {kind!r}", line)
    if not isinstance(weight, (int, float)) or isinstance(weight, bool):
        raise fail(f"component {i + 1}: weight must be a number, got {weight!r}", line)
    if cname in seen and explicit is None:  # unnamed components of one kind: goal, goal_2, ...
        cname = f"{cname}_{i + 1}"
    if cname in seen:
        raise fail(f"component {i + 1}: name {cname!r} is used twice", line)
    if not isinstance(cname, str) or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", cname or ""):
        raise fail(f"component {i + 1}: name {cname!r} must be an identifier", line)
    seen.add(cname)
    try:
        params = validate_component(kind, entry)
    except (TrajlakeError, ValueError, TypeError) as e:
        raise fail(f"component {i + 1} ({kind}): {e}", line) from None
    return Component(kind, cname, float(weight), params, line)


def _component_lines(text: str) -> list[int]:
    return [n for n, line in enumerate(text.splitlines(), 1) if line.strip().startswith("[[components]]")]


def _key_line(text: str, key: str) -> int:
    """The line of top-level `key` (`key = ...` before any table, or a `[key]` / `[[key]]` header); 0 if absent."""
    header = re.compile(rf"\s*\[\[?\s*{re.escape(key)}\s*\]")
    assign = re.compile(rf"\s*{re.escape(key)}\s*=")
    in_table = False
    for n, line in enumerate(text.splitlines(), 1):
        if header.match(line) or (not in_table and assign.match(line)):
            return n
        in_table = in_table or line.lstrip().startswith("[")
    return 0


def _line_of(text: str, header: str) -> int:
    return next((n for n, line in enumerate(text.splitlines(), 1) if line.strip().startswith(header)), 0)
