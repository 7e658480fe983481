"""Import OpenManus-RL / AgentGym trajectory files (parquet, JSON list, JSONL) into the store.

How a row becomes a task, an episode and its turns is agentgym_rows.py's. An import runs in stages, so that a bad
file, a refused run id or a template error leaves the lake as it was: the input files found and hashed; the run's
identity (its `ImportConfig`) checked against a run stored under that id; every row of every file read, held to
the caps and parsed; the episodes not stored yet tokenized; then written in chunks of whole episodes, one snapshot
each, inside the run's lease; and the run marked finished (failed, with the error, when the import is cut short:
`runs.open`, as for every stage).

Ids are deterministic: episode_id = uuid5(file sha256, row index, tokenizer fingerprint), and the default run_id
hashes the files and tokenizer, so importing the same files again inserts nothing, and an interrupted import
resumes where it stopped. The tokenizer is part of the ids because the stored token ids depend on it.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable
from os import PathLike
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from trajlake.collect.chat import ChatRenderer, tokenizer_fingerprint
from trajlake.core.clock import utc_now
from trajlake.core.errors import TrajlakeError
from trajlake.core.ids import InvalidIdError, check_id
from trajlake.interop.importers.agentgym_rows import parse_row
from trajlake.interop.importers.common import (
    ImportResult,
    file_sha256,
    progress_bar,
    resolve_files,
    stored_episode_ids,
)
from trajlake.interop.importers.config import ImportConfig
from trajlake.interop.importers.limits import Limits, TrajectoryImportError
from trajlake.interop.importers.records import SUFFIXES, iter_records, require_column
from trajlake.lm.load import load_tokenizer
from trajlake.schemas.records import Episode, Policy, Run
from trajlake.store import lease as run_lease
from trajlake.store import runs

_TOKENIZE_BATCH = 64  # rows per tokenizer call: big enough to batch, small enough for a live progress bar


def check_labels(*, run_id: str | None, env: str | None, split: str | None, what: str = "{}") -> None:
    """The names a user gives an import, checked as ids (None: "from the files" / "generated"). An empty one is
    refused, not treated as absent: `--run-id ""` was replaced by a generated id and `--env ""` by the file's
    own. `what` formats each name for the message (the CLI passes "--{}")."""
    for name, value in (("run-id" if what.startswith("--") else "run_id", run_id), ("env", env), ("split", split)):
        try:
            check_id(value, what.format(name))
        except InvalidIdError as e:
            raise TrajectoryImportError(str(e)) from None


def import_agentgym(
    lake: Any,
    paths: str | PathLike | Iterable[str | PathLike],
    tokenizer_path: Any,
    *,
    run_id: str | None = None,
    env: str | None = None,
    split: str | None = None,
    policy_id: str = "agentgym-expert",
    chunk_size: int = 256,
    progress: bool = True,
    limits: Limits = Limits(),
) -> ImportResult:
    """Import AgentGym-format trajectory files into `lake` as the run `run_id` (default: a hash of the files,
    tokenizer, policy, env and split); see the module docstring for the stages.

    `tokenizer_path` is a local tokenizer folder (or a loaded tokenizer). Every file is read, validated and
    tokenized before the first write, so a bad file raises `TrajectoryImportError` (naming the file, row and
    field) with the lake unchanged; so does a `run_id` stored as another kind of run or as an import of other
    files. Each chunk of `chunk_size` episodes is written with its turns and tasks in one snapshot; the first
    chunk also carries the run ("running") and the policy, and the run is marked "finished" at the end.
    Episodes already stored are skipped before tokenizing. Rows are held to `limits` (interop/importers/
    limits.py) as they are read. Returns counts of inserted and skipped rows per table.
    """
    if chunk_size < 1:
        raise TrajectoryImportError(f"chunk_size must be at least 1, got {chunk_size}")
    check_labels(run_id=run_id, env=env, split=split)
    files = resolve_files(paths)
    renderer, tok_name, tok_fp = _renderer(tokenizer_path)
    shas = _hash_files(files)
    config = ImportConfig("agentgym", files=tuple({"path": str(p.resolve()), "sha256": s} for p, s in
                                                  zip(files, shas, strict=True)),
                          tokenizer_fingerprint=tok_fp, policy_id=policy_id, env=env, split=split,
                          tokenizer=tok_name, chunk_size=chunk_size)
    if run_id is None:
        run_id = runs.hashed_run_id("import-agentgym-", [sorted(shas), tok_fp, policy_id, env, split], 16)
    run_lease.check(lake, run_id)  # another live process importing this run: refused before any row is read
    # The lease before tokenizing and writing, once every row was validated (a refused file leaves the lake as it
    # was, lease rows included). An import with nothing to write (every episode stored, its run finished or never
    # begun) takes none.
    with runs.open(lake, "import", config, run_id=run_id, error=TrajectoryImportError, lease=False) as run:
        episodes, per_file = _read(files, shas, tok_fp, env, split, limits)
        config = dataclasses.replace(config, files=tuple({**f, "rows": per_file[p]["episodes"]}
                                                         for f, p in zip(config.files, per_file, strict=True)))
        new, old = _not_stored(lake, episodes)
        written = _Written(skipped={"episodes": len(old), "turns": sum(len(e["turns"]) for e in old)})
        if new or (run.resumed is not None and run.resumed.status != "finished"):
            run.take_lease()
            _tokenize_all(renderer, new, progress)
            if run.resumed is not None:  # one an interrupted or failed import left: ended again below
                written.add_snapshot(run.restart())
            _write(run, Run(run_id, "import", config=dataclasses.asdict(config), status="running",
                            started_at=utc_now()), new, written, progress)
            written.add_snapshot(run.finish())
    return ImportResult(
        run_id=run_id, files=tuple(str(p) for p in files), episodes=len(episodes),
        turns=sum(len(e["turns"]) for e in episodes), inserted=written.inserted, skipped=written.skipped,
        snapshots=tuple(written.snapshots), per_file=per_file,
    )


def _renderer(tokenizer_path: Any) -> tuple[ChatRenderer, str, str]:
    """(the chat renderer, the tokenizer's name as stored, its fingerprint) for a tokenizer folder or a loaded
    tokenizer."""
    tokenizer, name = tokenizer_path, str(getattr(tokenizer_path, "name_or_path", type(tokenizer_path).__name__))
    if isinstance(tokenizer_path, (str, PathLike)):
        name = str(tokenizer_path)
        try:
            tokenizer = load_tokenizer(tokenizer_path)
        except TrajlakeError as e:
            raise TrajectoryImportError(str(e)) from None
    try:
        renderer = ChatRenderer(tokenizer)
    except TrajlakeError as e:
        raise TrajectoryImportError(f"tokenizer {name}: {e}") from None
    return renderer, name, tokenizer_fingerprint(tokenizer)


def _not_stored(lake: Any, episodes: list[dict]) -> tuple[list[dict], list[dict]]:
    """(the episodes to write, those stored already). A stored episode (an earlier or interrupted import, or a
    copy of a file given twice) needs no tokens: chunks are atomic, so it has all its turns."""
    seen = stored_episode_ids(lake, [e["id"] for e in episodes])
    new, old = [], []
    for e in episodes:
        (old if e["id"] in seen else new).append(e)
        seen.add(e["id"])
    return new, old


def _hash_files(files: list[Path]) -> list[str]:
    """Each file's sha256; a parquet file without conversations is refused from its schema first, before any
    file is read."""
    for f in files:
        if SUFFIXES[f.suffix.lower()] == "parquet":
            require_column(f, "conversations")
    return [file_sha256(f) for f in files]


def _read(files: list[Path], shas: list[str], tok_fp: str, env: str | None, split: str | None,
          limits: Limits) -> tuple[list[dict], dict[str, dict[str, int]]]:
    """Every row of every file parsed and validated (one bad row refuses the import), and each file's counts.
    Rows are read one at a time and only their parsed form is kept."""
    episodes: list[dict] = []
    per_file: dict[str, dict[str, int]] = {}
    for path, sha in zip(files, shas, strict=True):
        parsed = [parse_row(row, path, sha, i, tok_fp, env, split, limits) for i, _, row in iter_records(path, limits)]
        per_file[str(path)] = {"episodes": len(parsed), "turns": sum(len(e["turns"]) for e in parsed)}
        episodes += parsed
    return episodes, per_file


@dataclasses.dataclass
class _Written:
    """What the writes of an import added up to: rows inserted and skipped per table, and the snapshots made."""

    inserted: dict[str, int] = dataclasses.field(
        default_factory=lambda: dict.fromkeys(("runs", "policies", "tasks", "episodes", "turns"), 0))
    skipped: dict[str, int] = dataclasses.field(default_factory=dict)
    snapshots: list[int] = dataclasses.field(default_factory=list)

    def add(self, result: Any) -> None:
        for total, counts in ((self.inserted, result.inserted), (self.skipped, result.skipped)):
            for name, k in counts.items():
                total[name] = total.get(name, 0) + k
        self.add_snapshot(result.snapshot_id)

    def add_snapshot(self, snapshot: int | None) -> None:
        if snapshot is not None:
            self.snapshots.append(snapshot)


def _tokenize_all(renderer: ChatRenderer, episodes: list[dict], progress: bool) -> None:
    """Token ids for every episode, a batch at a time (template errors surface here, still unwritten)."""
    with progress_bar("tokenizing", len(episodes), progress) as bar:
        for start in range(0, len(episodes), _TOKENIZE_BATCH):
            _tokenize(renderer, episodes[start:start + _TOKENIZE_BATCH])
            bar.update(advance=len(episodes[start:start + _TOKENIZE_BATCH]))


def _write(ledger: runs.OpenRun, run: Run, episodes: list[dict], written: _Written, progress: bool) -> None:
    """The episodes in chunks of whole episodes, one snapshot each: the first chunk carries the run and its
    policy, so that no episode is visible before them; a task row comes with the first episode of its task."""
    chunk_size, policy_id = run.config["chunk_size"], run.config["policy_id"]
    policy = Policy(policy_id, run_id=run.run_id, created_at=run.started_at)
    chunks = [episodes[i:i + chunk_size] for i in range(0, len(episodes), chunk_size)]
    tasks_seen: set[str] = set()
    with progress_bar("writing", len(episodes), progress) as bar:
        for n, chunk in enumerate(chunks):
            data: dict[str, Any] = {"policies": [policy]} if n == 0 else {}
            tasks = {}
            for e in chunk:
                if e["task"].task_id not in tasks_seen:
                    tasks.setdefault(e["task"].task_id, e["task"])
            tasks_seen.update(tasks)
            if tasks:
                data["tasks"] = list(tasks.values())
            data["episodes"] = [Episode(**e["episode"], run_id=run.run_id, policy_id=policy_id) for e in chunk]
            data["turns"] = _turns_table(chunk)
            message = f"import: agentgym chunk {n + 1}/{len(chunks)} ({len(chunk)} episodes) run {run.run_id}"
            if n == 0:
                written.add(ledger.begin(run, message=message, rows=data))
            else:
                written.add(ledger.lake.append(data, stage="import", run_id=run.run_id, message=message))
            bar.update(advance=len(chunk))


def _tokenize(renderer: ChatRenderer, batch: list[dict]) -> None:
    """Render and tokenize a batch of parsed rows in place (one tokenizer call for the batch)."""
    texts = []
    for e in batch:
        try:
            texts += [t for pair in renderer.segment_texts(e["messages"], e["agent"]) for t in pair]
        except TrajlakeError as err:
            raise TrajectoryImportError(f"{e['where']}: {err}") from None
    ids = iter(renderer.encode_many(texts))
    for e in batch:
        for t in e["turns"]:
            t["prompt_token_ids"] = np.asarray(next(ids), dtype=np.int32)
            t["response_token_ids"] = np.asarray(next(ids), dtype=np.int32)
        e["episode"]["num_agent_tokens"] = sum(len(t["response_token_ids"]) for t in e["turns"])
        del e["messages"], e["agent"]  # no longer needed: keep memory to the token arrays


def _turns_table(chunk: list[dict]) -> pa.Table:
    """The turns of whole episodes as an Arrow table (token ids as int32 lists, built without Python lists)."""
    rows = [(e["id"], k, t, k == len(e["turns"]) - 1) for e in chunk for k, t in enumerate(e["turns"])]

    def ids(key: str) -> pa.ListArray:
        arrays = [t[key] for _, _, t, _ in rows]
        offsets = np.zeros(len(arrays) + 1, dtype=np.int32)
        np.cumsum([len(a) for a in arrays], out=offsets[1:])
        values = np.concatenate(arrays) if arrays else np.zeros(0, np.int32)
        return pa.ListArray.from_arrays(pa.array(offsets), pa.array(values, pa.int32()))

    return pa.table({
        "episode_id": [r[0] for r in rows],
        "turn": pa.array([r[1] for r in rows], pa.int32()),
        "observation": [r[2]["observation"] for r in rows],
        "action_text": [r[2]["action_text"] for r in rows],
        "action": pa.array([r[2]["action"] for r in rows], pa.string()),
        "format_ok": [r[2]["format_ok"] for r in rows],
        "done": [r[3] for r in rows],
        "info": [json.dumps(r[2]["info"], sort_keys=True) for r in rows],
        "prompt_token_ids": ids("prompt_token_ids"),
        "response_token_ids": ids("response_token_ids"),
    })


