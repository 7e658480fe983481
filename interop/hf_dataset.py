"""Episodes as a Hugging Face `datasets` dataset (`trajlake export DIR --dataset`), and back into a lake
(`trajlake import dataset DIR`).

One row per episode, in the formats the peers read:

- `messages`: the conversation as TRL's conversational datasets hold it, `{role, content}` (the run's system
  prompt, then each turn's observation as `user` and reply as `assistant`);
- `conversations`: the same as AgentGym's and OpenManus-RL's files, `{from, value, loss}` (human / gpt, `loss`
  true on the agent's replies), which `trajlake import agentgym` reads too;
- `input_ids`, `loss_mask`, `behaviour_logprobs`: the exact token sequence the model saw and sampled (prompt
  and reply ids of every turn, concatenated), 1 on agent tokens, the sampled tokens' log-probs (None
  elsewhere and for text policies);
- with a reward spec: `spec_id`, `reward` (the episode's total) and `token_rewards` (the allocation, one
  value per token of `input_ids`);
- every column of the episode, its run (`run_kind`, `run_config`), its task (`task_*`) and, in `turns`, every
  stored turn (JSON columns as JSON text): what `import` needs to store the same episodes again.

The folder holds the dataset as `save_to_disk` writes it (`datasets.load_from_disk(DIR)`) and the same rows as
`DIR/episodes.parquet` (`datasets.load_dataset("parquet", data_files=...)`, polars, DuckDB).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa

from trajlake.core.atomic import atomic_output
from trajlake.core.errors import TrajlakeError
from trajlake.core.text_files import read_text_file
from trajlake.interop.importers.limits import Limits, check_row
from trajlake.interop.importers.records import ARROW_BATCH, arrow_rows, parquet_batches, parquet_columns
from trajlake.store.reads import check_episode_filter, episode_rewards, stored_episode_ids

PARQUET = "episodes.parquet"
TURN_FIELDS = ("turn", "observation", "action_text", "action", "format_ok", "step_reward", "done", "info",
               "prompt_token_ids", "response_token_ids", "response_logprobs", "latency_ms")
EPISODE_FIELDS = ("episode_id", "run_id", "policy_id", "task_id", "env", "group_id", "sample_index", "status",
                  "success", "env_reward", "num_turns", "num_agent_tokens", "error", "started_at", "finished_at")
TASK_FIELDS = ("split", "instruction", "seed", "ground_truth", "meta")

EPISODES_SQL = """
SELECT {episode}, r.kind AS run_kind, r.config::VARCHAR AS run_config, r.parent_run_id AS run_parent_id,
       t.env AS task_env, {task},
       (SELECT list({{{turn}}} ORDER BY u.turn) FROM turns u WHERE u.episode_id = e.episode_id) AS turns
FROM episodes e LEFT JOIN runs r USING (run_id) LEFT JOIN tasks t USING (task_id)
WHERE e.episode_id IN (SELECT episode_id FROM episodes WHERE ({where}\n)) ORDER BY e.episode_id
"""


def _json_text(column: str) -> str:
    return f"{column}::VARCHAR"


def _select_sql(where: str) -> str:
    episode = ", ".join(f"e.{c}" for c in EPISODE_FIELDS)
    task = ", ".join(f"{_json_text('t.' + c) if c in ('ground_truth', 'meta') else 't.' + c} AS task_{c}"
                     for c in TASK_FIELDS)
    turn = ", ".join(f"'{c}': {_json_text('u.' + c) if c == 'info' else 'u.' + c}" for c in TURN_FIELDS)
    return EPISODES_SQL.format(episode=episode, task=task, turn=turn, where=where)


def _conversation(system: str | None, turns: list[dict]) -> tuple[list[dict], list[dict]]:
    messages = [{"role": "system", "content": system}] if system else []
    conversations = [{"from": "system", "value": system, "loss": False}] if system else []
    for t in turns:
        messages += [{"role": "user", "content": t["observation"] or ""},
                     {"role": "assistant", "content": t["action_text"] or ""}]
        conversations += [{"from": "human", "value": t["observation"] or "", "loss": False},
                          {"from": "gpt", "value": t["action_text"] or "", "loss": True}]
    return messages, conversations


#: episodes turned into Python rows at a time while exporting: the rows of a whole export held at once took about
#: 250 kB an episode of 10 turns (bench/scale.py), the Arrow table they become a tenth of it
EXPORT_BATCH = 500


def episode_rows(lake, where: str = "true", *, spec=None, snapshot: int | None = None) -> list[dict[str, Any]]:
    """The dataset's rows for the episodes `where` selects (SQL over episodes columns) at `snapshot`; with a
    reward spec (a loaded RewardSpec), its rewards, scored first where they are not yet."""
    return [row for batch in episode_batches(lake, where, spec=spec, snapshot=snapshot) for row in batch]


def episode_batches(lake, where: str = "true", *, spec=None, snapshot: int | None = None,
                    size: int | None = None) -> Iterator[list[dict[str, Any]]]:
    """`episode_rows`, `size` (default EXPORT_BATCH) episodes at a time (the stored rows are read once, in Arrow;
    only a batch is ever Python objects)."""
    check_episode_filter(lake, where, what="export --dataset --where", snapshot=snapshot)
    rewards: dict[str, dict] = {}
    if spec is not None:
        from trajlake.rewards.score import score

        if snapshot is None:
            score(lake, spec, where=where)  # what is scored already is skipped
        rewards = {r["episode_id"]: r
                   for r in episode_rewards(lake, spec.spec_id, where, snapshot=snapshot).to_pylist()}
    table = lake.query(_select_sql(where), snapshot=snapshot, output="arrow")
    for batch in table.to_batches(max_chunksize=size or EXPORT_BATCH):
        if batch.num_rows:
            yield [_dataset_row(r, spec, rewards) for r in batch.to_pylist()]


def _dataset_row(r: dict[str, Any], spec, rewards: dict[str, dict]) -> dict[str, Any]:
    """One stored episode's row (as the query gives it) with its conversation, token sequence and rewards."""
    turns = r["turns"] or []
    system = json.loads(r["run_config"]).get("system_prompt") if r["run_config"] else None
    r["messages"], r["conversations"] = _conversation(system, turns)
    ids, mask, logprobs = [], [], []
    for t in turns:
        p, a = list(t["prompt_token_ids"] or ()), list(t["response_token_ids"] or ())
        lp = t["response_logprobs"]
        ids += p + a
        mask += [0] * len(p) + [1] * len(a)
        logprobs += [None] * len(p) + (list(lp) if lp is not None else [None] * len(a))
    r.update(input_ids=ids, loss_mask=mask, behaviour_logprobs=logprobs)
    if spec is not None:
        got = rewards.get(r["episode_id"])
        token_rewards = [0.0] * len(ids)
        for k in (got or {}).get("tokens") or []:
            if k["position"] is not None:
                token_rewards[k["position"]] = k["reward"]
        r.update(spec_id=spec.spec_id, reward=got["total"] if got else None,
                 token_rewards=token_rewards if got else None)
    return r


def export_dataset(lake, out: str | Path, where: str = "true", *, spec=None, snapshot: int | None = None) -> int:
    """Write the episodes `where` selects as a `datasets` dataset in folder `out` (and `out/episodes.parquet`);
    returns how many. Refuses a folder that exists and is not empty, and a filter that selects nothing."""
    import datasets

    out = Path(out)
    if out.exists() and any(out.iterdir()):
        raise TrajlakeError(f"{out} exists and is not empty: export into a new folder")
    # each batch's rows become Arrow before the next is made; a column that is null throughout one batch takes
    # its type from the others (permissive promotion)
    tables = [pa.Table.from_pylist(rows) for rows in episode_batches(lake, where, spec=spec, snapshot=snapshot)]
    if not tables:
        raise TrajlakeError(f"--where {where!r} selects no episode: nothing to export")
    table = pa.concat_tables(tables, promote_options="permissive")
    ds = datasets.Dataset(table)
    out.parent.mkdir(parents=True, exist_ok=True)
    with atomic_output(out, folder=True) as fresh:  # whole or not at all, never through a link planted in it
        ds.save_to_disk(str(fresh))
        ds.to_parquet(str(fresh / PARQUET))
    return table.num_rows


def _sources(folder: Path) -> list[tuple[str, Any]]:
    """Where the rows are, as (name, source): a folder save_to_disk wrote, as its memory-mapped Arrow table
    (read a batch at a time, never whole), else each parquet file (the folder's, or the file given)."""
    if (folder / "dataset_info.json").is_file():
        return [(str(folder), _saved_table(folder))]
    files = sorted(folder.glob("*.parquet")) if folder.is_dir() else [folder] if folder.suffix == ".parquet" else []
    if not files:
        raise TrajlakeError(f"{folder}: no dataset here (a folder saved with save_to_disk, or parquet files)")
    return [(str(f), f) for f in files]


def _saved_table(folder: Path) -> pa.Table:
    """The memory-mapped table of a folder `save_to_disk` wrote, its `state.json` checked first: `load_from_disk`
    joins each `_data_files` name to the folder as given, so an absolute name or `../` read an Arrow file from
    anywhere on the machine, and a malformed state ended in a bare KeyError or TypeError."""
    import datasets
    from pyarrow.lib import ArrowException

    read = {}
    for name in ("state.json", "dataset_info.json"):
        text = read_text_file(folder / name, f"dataset {name}")  # its own refusal: missing, too large, not text
        try:
            read[name] = json.loads(text)
        except ValueError as e:  # JSONDecodeError: not what save_to_disk writes
            raise TrajlakeError(f"{folder / name}: not JSON ({e})") from None
        except RecursionError:
            raise TrajlakeError(f"{folder / name}: nests too deep to be a dataset's {name}") from None
        if not isinstance(read[name], dict):
            raise TrajlakeError(f"{folder / name}: not a JSON object, as save_to_disk writes it")
    files = read["state.json"].get("_data_files")
    if not (isinstance(files, list) and files and all(isinstance(f, dict) for f in files)):
        raise TrajlakeError(f"{folder / 'state.json'}: `_data_files` is not a list of the folder's Arrow files")
    for f in files:
        name = f.get("filename")
        if not (isinstance(name, str) and name == Path(name).name and name not in (".", "..")
                and (folder / name).is_file() and not (folder / name).is_symlink()):
            raise TrajlakeError(f"{folder / 'state.json'}: data file {str(name)[:200]!r} is not a file of "
                                f"{folder} (a dataset reads only its own folder's files)")
    try:
        return datasets.load_from_disk(str(folder)).data.table
    except (ArrowException, OSError, ValueError, KeyError, TypeError) as e:
        raise TrajlakeError(f"{folder}: not a dataset save_to_disk wrote ({type(e).__name__}: "
                            f"{str(e).splitlines()[0][:200] if str(e) else 'unreadable'})") from None


def _rows(sources: list[tuple[str, Any]], limits: Limits) -> Iterator[dict[str, Any]]:
    """Every row of every source, each measured in Arrow and held to `limits` before it is used (as an import
    of AgentGym files is: interop/importers/records.py)."""
    for name, source in sources:
        batches = (source.to_batches(max_chunksize=ARROW_BATCH) if isinstance(source, pa.Table)
                   else parquet_batches(source, limits))
        for _, where, row in arrow_rows(batches, f"{name} row", limits):
            check_row(row, where, limits)
            yield row


def _json(text: Any) -> Any:
    return json.loads(text) if isinstance(text, str) else text


def import_dataset(lake, folder: str | Path, *, limits: Limits = Limits()) -> dict[str, int]:
    """Store the episodes of a dataset `export_dataset` wrote (their runs, tasks and turns) in `lake`, in one
    snapshot; episodes already stored are skipped. Rows are read a batch at a time and each is held to `limits`
    (its size, a text's size, its nesting, finite numbers) before anything is written. Returns the rows
    written per table."""
    from trajlake.schemas import Episode, Run, Task, Turn
    from trajlake.store import runs as ledger

    folder = Path(folder)
    sources = _sources(folder)
    needed = {*EPISODE_FIELDS, "turns", "run_kind", "run_config"}
    for name, source in sources:
        columns = source.column_names if isinstance(source, pa.Table) else parquet_columns(source)
        missing = sorted(needed - set(columns))
        if missing:
            raise TrajlakeError(f"{name}: not a trajlake episode dataset (no column {', '.join(missing)}); "
                                "trajlake import agentgym reads AgentGym's conversation files")
    have = stored_episode_ids(lake)
    runs, tasks, episodes, turns = {}, {}, [], []
    for r in _rows(sources, limits):
        if r["episode_id"] in have:
            continue
        if r["run_id"] and r["run_kind"]:
            runs.setdefault(r["run_id"], Run(r["run_id"], r["run_kind"], config=_json(r["run_config"]),
                                             status="finished", parent_run_id=r.get("run_parent_id")))
        if r["task_id"] and r.get("task_env"):
            tasks.setdefault(r["task_id"], Task(r["task_id"], r["task_env"], split=r.get("task_split"),
                                                instruction=r.get("task_instruction"), seed=r.get("task_seed"),
                                                ground_truth=_json(r.get("task_ground_truth")),
                                                meta=_json(r.get("task_meta"))))
        episodes.append(Episode(**{c: r[c] for c in EPISODE_FIELDS}))
        for t in r["turns"] or []:
            turns.append(Turn(r["episode_id"], **{**{c: t[c] for c in TURN_FIELDS}, "info": _json(t["info"]),
                                                 "prompt_token_ids": tuple(t["prompt_token_ids"] or ()),
                                                 "response_token_ids": tuple(t["response_token_ids"] or ()),
                                                 "response_logprobs": (tuple(t["response_logprobs"])
                                                                       if t["response_logprobs"] is not None
                                                                       else None)}))
    if not episodes:
        return {"episodes": 0, "turns": 0, "runs": 0, "tasks": 0}
    stored = ledger.record(lake, list(runs.values()), stage="import", message=f"import dataset {folder}",
                           rows={"tasks": list(tasks.values()), "episodes": episodes, "turns": turns})
    return {"episodes": len(episodes), "turns": len(turns), "runs": len(runs), "tasks": len(tasks),
            "snapshot": stored.snapshot_id}


__all__ = ["export_dataset", "import_dataset", "episode_batches", "episode_rows"]
