"""The `python` kind: a `module:function` computing one value per episode on an Arrow table, joined into the
query as the table `py_<component>`."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from trajlake.core.errors import TrajlakeError
from trajlake.rewards.component_kind import ComponentKind, no_columns


def load_function(ref: Any) -> Callable:
    """Import `module:function`."""
    if not isinstance(ref, str) or ":" not in ref:
        raise TrajlakeError(f"function must be 'module:function', got {ref!r}")
    module, _, name = ref.partition(":")
    try:
        fn = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as e:
        raise TrajlakeError(f"cannot import {ref}: {e}") from None
    if not callable(fn):
        raise TrajlakeError(f"{ref} is not callable")
    return fn


def _call(name: str, params: dict, inputs: Any) -> Any:
    """A python component's values: its function on the episodes table, one float per row, checked."""
    import pyarrow as pa

    ref = params["function"]
    fn = load_function(ref)
    try:
        values = pa.array(fn(inputs), type=pa.float64())
    except Exception as e:  # user code: report which function failed and how
        raise TrajlakeError(f"python component {name} ({ref}) failed: {e}") from None
    if len(values) != inputs.num_rows:
        raise TrajlakeError(f"python component {name} returned {len(values)} values for {inputs.num_rows} episodes")
    return values


PYTHON = ComponentKind(
    kind="python",
    doc="A `function = \"module:function\"` called with a pyarrow Table (one row per episode: episodes columns "
    "plus lists over its turns: action_texts, observations, step_rewards, format_oks, agent_tokens) and "
    "returning one float per row (a list, numpy or Arrow array).",
    defaults={"function": None},
    check=lambda p: load_function(p["function"]),
    turn_columns=no_columns,
    aggregates=no_columns,
    value=lambda n, p: f"py_{n}.value",
    compute=_call,
)
