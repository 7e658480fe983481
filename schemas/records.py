"""Frozen record types mirroring the Arrow schemas in `schemas.tables`, for Python code.

JSON columns hold plain Python values here (dicts, lists); `to_table` serialises them. A test checks that
every record's fields equal its table's columns, in order, so the two cannot drift apart.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import pyarrow as pa

from trajlake.schemas.tables import TABLES, is_json


@dataclass(frozen=True)
class Task:
    task_id: str
    env: str
    split: str | None = None
    instruction: str | None = None
    seed: int | None = None
    ground_truth: Any = None
    meta: Any = None


@dataclass(frozen=True)
class Run:
    run_id: str
    kind: str
    config: Any = None
    status: str | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    code_version: str | None = None
    parent_run_id: str | None = None


@dataclass(frozen=True)
class Policy:
    policy_id: str
    run_id: str | None = None
    step: int | None = None
    base_model: str | None = None
    checkpoint_uri: str | None = None
    parent_policy_id: str | None = None
    created_at: datetime | None = None


@dataclass(frozen=True)
class Episode:
    episode_id: str
    run_id: str | None = None
    policy_id: str | None = None
    task_id: str | None = None
    env: str | None = None
    group_id: str | None = None
    sample_index: int | None = None
    status: str | None = None
    success: bool | None = None
    env_reward: float | None = None
    num_turns: int | None = None
    num_agent_tokens: int | None = None
    error: str | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None


@dataclass(frozen=True)
class Turn:
    episode_id: str
    turn: int
    observation: str | None = None
    action_text: str | None = None
    action: str | None = None
    format_ok: bool | None = None
    step_reward: float | None = None
    done: bool | None = None
    info: Any = None
    prompt_token_ids: Sequence[int] = field(default_factory=tuple)
    response_token_ids: Sequence[int] = field(default_factory=tuple)
    response_logprobs: Sequence[float] | None = None
    latency_ms: float | None = None
    #: set by the store when the turn is written (the lengths of the two id lists); leave them None
    num_prompt_tokens: int | None = None
    num_response_tokens: int | None = None


@dataclass(frozen=True)
class RewardSpecRow:
    spec_id: str
    name: str | None = None
    spec: Any = None
    created_at: datetime | None = None


@dataclass(frozen=True)
class EpisodeReward:
    spec_id: str
    episode_id: str
    total: float | None = None
    components: dict[str, float] | None = None


@dataclass(frozen=True)
class TurnReward:
    spec_id: str
    episode_id: str
    turn: int
    reward: float | None = None


@dataclass(frozen=True)
class TrainStep:
    run_id: str
    step: int
    policy_id: str | None = None
    snapshot_read: int | None = None
    metrics: Any = None
    spec_id: str | None = None
    episode_ids: tuple[str, ...] | None = None


@dataclass(frozen=True)
class RunLease:
    run_id: str
    stage: str | None = None
    host: str | None = None
    pid: int | None = None
    process_start: str | None = None
    token: str | None = None
    acquired_at: datetime | None = None


RECORD_TYPES: dict[str, type] = {
    "tasks": Task,
    "runs": Run,
    "policies": Policy,
    "episodes": Episode,
    "turns": Turn,
    "reward_specs": RewardSpecRow,
    "episode_rewards": EpisodeReward,
    "turn_rewards": TurnReward,
    "train_steps": TrainStep,
    "run_leases": RunLease,
}
TABLE_OF: dict[type, str] = {cls: name for name, cls in RECORD_TYPES.items()}


def to_table(records: Sequence[Any], table: str | None = None) -> pa.Table:
    """Records of one type -> an Arrow table with that type's store schema (JSON fields serialised).

    `table` is needed only when `records` is empty.
    """
    if not records and table is None:
        raise ValueError("to_table needs `table` when there are no records")
    name = table or TABLE_OF.get(type(records[0]))
    if name is None:
        raise TypeError(f"{type(records[0]).__name__} is not a store record type")
    schema = TABLES[name].schema
    cls = RECORD_TYPES[name]
    for r in records:
        if type(r) is not cls:
            raise TypeError(f"table {name} takes {cls.__name__} records, got {type(r).__name__}")
    columns = {}
    for f in schema:
        values = [getattr(r, f.name) for r in records]
        if is_json(f):
            values = [None if v is None else json.dumps(v, sort_keys=True) for v in values]
        elif pa.types.is_map(f.type):
            values = [None if v is None else list(v.items()) for v in values]
        elif pa.types.is_list(f.type):
            values = [None if v is None else list(v) for v in values]
        try:
            columns[f.name] = pa.array(values, type=f.type)
        except (TypeError, pa.ArrowException) as e:  # name the column: the Arrow message does not
            raise type(e)(f"column {f.name}: {e}") from None
    return pa.table(columns, schema=schema)


def from_table(table: pa.Table, name: str) -> list[Any]:
    """An Arrow table of store table `name` -> records (JSON fields parsed)."""
    schema = TABLES[name].schema
    cls = RECORD_TYPES[name]
    rows = table.select([f.name for f in schema]).to_pylist()
    out = []
    for row in rows:
        for f in schema:
            v = row[f.name]
            if v is None:
                continue
            if is_json(f):
                row[f.name] = json.loads(v)
            elif pa.types.is_map(f.type):
                row[f.name] = dict(v)
            elif pa.types.is_list(f.type):
                row[f.name] = tuple(v)
        out.append(cls(**row))
    return out


def record_fields(cls: type) -> list[str]:
    return [f.name for f in dataclasses.fields(cls)]
