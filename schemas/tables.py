"""Arrow schemas of every store table: the single source of truth.

The store's DDL is generated from these schemas (`TableDef.ddl`), the frozen record types in
`schemas.records` mirror them (a test checks they agree), and every append is validated against them.
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa

#: Field metadata marking a string column that holds JSON text (DuckDB type JSON).
JSON_META = {b"trajlake.type": b"json"}
TIMESTAMP = pa.timestamp("us", tz="UTC")
TOKEN_IDS = pa.list_(pa.int32())
LOGPROBS = pa.list_(pa.float32())


def _f(name: str, type_: pa.DataType, nullable: bool = True) -> pa.Field:
    return pa.field(name, type_, nullable=nullable)


def _json(name: str) -> pa.Field:
    return pa.field(name, pa.string(), nullable=True, metadata=JSON_META)


def is_json(field: pa.Field) -> bool:
    return bool(field.metadata) and field.metadata.get(b"trajlake.type") == b"json"


@dataclass(frozen=True)
class TableDef:
    """One store table: its Arrow schema and the columns that identify a row.

    Appends are idempotent by `key`: a row whose key is already stored is skipped.
    """

    name: str
    schema: pa.Schema
    key: tuple[str, ...]
    doc: str
    #: columns the store computes at write time: column -> the list column whose length it holds (0 for a
    #: null list). Queries read the count instead of decoding every list only to measure it.
    list_lengths: tuple[tuple[str, str], ...] = ()

    def length_sql(self, column: str) -> str:
        """SQL computing the derived `column` from its list (for lakes and snapshots written before it)."""
        return f"CAST(coalesce(len({dict(self.list_lengths)[column]}), 0) AS INTEGER)"

    def ddl(self, catalog: str) -> str:
        """`CREATE TABLE IF NOT EXISTS` for this table in the attached `catalog`."""
        cols = ", ".join(f"{f.name} {duckdb_type(f)}" for f in self.schema)
        return f"CREATE TABLE IF NOT EXISTS {catalog}.{self.name} ({cols})"


def duckdb_type(field: pa.Field) -> str:
    """DuckDB type for an Arrow field of a store schema (only the types the schemas use)."""
    if is_json(field):
        return "JSON"
    return _duck(field.type)


def _duck(t: pa.DataType) -> str:
    simple = {
        pa.string(): "VARCHAR",
        pa.int32(): "INTEGER",
        pa.int64(): "BIGINT",
        pa.float32(): "FLOAT",
        pa.float64(): "DOUBLE",
        pa.bool_(): "BOOLEAN",
        TIMESTAMP: "TIMESTAMPTZ",
    }
    if t in simple:
        return simple[t]
    if pa.types.is_list(t):
        return f"{_duck(t.value_type)}[]"
    if pa.types.is_map(t):
        return f"MAP({_duck(t.key_type)}, {_duck(t.item_type)})"
    raise TypeError(f"no DuckDB type for Arrow type {t}")


TASKS = TableDef(
    "tasks",
    pa.schema([
        _f("task_id", pa.string(), False),
        _f("env", pa.string(), False),
        _f("split", pa.string()),
        _f("instruction", pa.string()),
        _f("seed", pa.int64()),
        _json("ground_truth"),
        _json("meta"),
    ]),
    ("task_id",),
    "One instance of an env to solve.",
)

RUNS = TableDef(
    "runs",
    pa.schema([
        _f("run_id", pa.string(), False),
        _f("kind", pa.string(), False),
        _json("config"),
        _f("status", pa.string()),
        _f("started_at", TIMESTAMP),
        _f("finished_at", TIMESTAMP),
        _f("code_version", pa.string()),
        _f("parent_run_id", pa.string()),
    ]),
    ("run_id",),
    "One invocation of a stage (collect, import, train, eval, ...) with its config.",
)

POLICIES = TableDef(
    "policies",
    pa.schema([
        _f("policy_id", pa.string(), False),
        _f("run_id", pa.string()),
        _f("step", pa.int64()),
        _f("base_model", pa.string()),
        _f("checkpoint_uri", pa.string()),
        _f("parent_policy_id", pa.string()),
        _f("created_at", TIMESTAMP),
    ]),
    ("policy_id",),
    "A model checkpoint (or an external policy such as a scripted expert), with its parent.",
)

EPISODES = TableDef(
    "episodes",
    pa.schema([
        _f("episode_id", pa.string(), False),
        _f("run_id", pa.string()),
        _f("policy_id", pa.string()),
        _f("task_id", pa.string()),
        _f("env", pa.string()),
        _f("group_id", pa.string()),
        _f("sample_index", pa.int32()),
        _f("status", pa.string()),
        _f("success", pa.bool_()),
        _f("env_reward", pa.float64()),
        _f("num_turns", pa.int32()),
        _f("num_agent_tokens", pa.int32()),
        _f("error", pa.string()),
        _f("started_at", TIMESTAMP),
        _f("finished_at", TIMESTAMP),
    ]),
    ("episode_id",),
    "One attempt at a task by one policy.",
)

TURNS = TableDef(
    "turns",
    pa.schema([
        _f("episode_id", pa.string(), False),
        _f("turn", pa.int32(), False),
        _f("observation", pa.string()),
        _f("action_text", pa.string()),
        _f("action", pa.string()),
        _f("format_ok", pa.bool_()),
        _f("step_reward", pa.float64()),
        _f("done", pa.bool_()),
        _json("info"),
        # Only the tokens new since the previous turn: concatenating prompt and response ids over the
        # turns of an episode gives the exact sequence the model saw; response ids are the agent tokens.
        _f("prompt_token_ids", TOKEN_IDS),
        _f("response_token_ids", TOKEN_IDS),
        _f("response_logprobs", LOGPROBS),
        _f("latency_ms", pa.float64()),
        # Computed by the store at write time (and filled in when an older lake is opened): the lengths of
        # the two id lists, so allocation and length rewards need not decode every id to count them.
        _f("num_prompt_tokens", pa.int32()),
        _f("num_response_tokens", pa.int32()),
    ]),
    ("episode_id", "turn"),
    "One observation -> one reply -> one env step, with exact token ids.",
    list_lengths=(("num_prompt_tokens", "prompt_token_ids"), ("num_response_tokens", "response_token_ids")),
)

REWARD_SPECS = TableDef(
    "reward_specs",
    pa.schema([
        _f("spec_id", pa.string(), False),
        _f("name", pa.string()),
        _json("spec"),
        _f("created_at", TIMESTAMP),
    ]),
    ("spec_id",),
    "A reward spec; its id is the hash of its content.",
)

EPISODE_REWARDS = TableDef(
    "episode_rewards",
    pa.schema([
        _f("spec_id", pa.string(), False),
        _f("episode_id", pa.string(), False),
        _f("total", pa.float64()),
        _f("components", pa.map_(pa.string(), pa.float64())),
    ]),
    ("spec_id", "episode_id"),
    "An episode's reward under a spec, with each component's value.",
)

TURN_REWARDS = TableDef(
    "turn_rewards",
    pa.schema([
        _f("spec_id", pa.string(), False),
        _f("episode_id", pa.string(), False),
        _f("turn", pa.int32(), False),
        _f("reward", pa.float64()),
    ]),
    ("spec_id", "episode_id", "turn"),
    "A spec's weighted process rewards per turn (non-zero only), for the per_turn allocation.",
)

TRAIN_STEPS = TableDef(
    "train_steps",
    pa.schema([
        _f("run_id", pa.string(), False),
        _f("step", pa.int64(), False),
        _f("policy_id", pa.string()),
        _f("snapshot_read", pa.int64()),
        _json("metrics"),
        # Lineage: the reward spec its batch was scored with and the episodes it trained on (read at
        # snapshot_read; an SFT row: every episode of the steps since the run's previous row).
        _f("spec_id", pa.string()),
        _f("episode_ids", pa.list_(pa.string())),
    ]),
    ("run_id", "step"),
    "Metrics of one training step, with the snapshot its batch was read from and what it trained on.",
)

RUN_LEASES = TableDef(
    "run_leases",
    pa.schema([
        _f("run_id", pa.string(), False),
        _f("stage", pa.string()),
        # the holder: a process on a host; process_start tells a reused pid apart (store/lease.py)
        _f("host", pa.string()),
        _f("pid", pa.int64()),
        _f("process_start", pa.string()),
        _f("token", pa.string()),
        _f("acquired_at", TIMESTAMP),
    ]),
    ("run_id",),
    "The live process running a run (one per run id): taken when a run starts writing, released when it ends.",
)

TABLES: dict[str, TableDef] = {
    t.name: t
    for t in (TASKS, RUNS, POLICIES, EPISODES, TURNS, REWARD_SPECS, EPISODE_REWARDS, TURN_REWARDS, TRAIN_STEPS,
              RUN_LEASES)
}


def table_def(name: str) -> TableDef:
    """The table named `name`; an unknown name raises an error listing the valid ones."""
    try:
        return TABLES[name]
    except KeyError:
        raise KeyError(f"unknown table {name!r}; tables are: {', '.join(TABLES)}") from None
