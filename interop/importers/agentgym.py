"""Import OpenManus-RL / AgentGym trajectory files (parquet, JSON list, JSONL) into the store.

Each row is one episode: ``conversations`` is a list of ``{from, value, loss}`` messages, ``from`` being
human/user, gpt/assistant or system. Mapping decisions:

* Agent turns: if any gpt message of the row has ``loss: true``, exactly those are agent turns (the row
  selects its training targets explicitly, so unmarked replies are context). Otherwise every gpt message
  except ``loss: false`` ones is an agent turn. Non-agent gpt messages (the "OK. I'll follow your
  instructions" acknowledgement) are rendered as assistant messages inside the next turn's prompt ids.
* A turn: ``observation`` = the human/system texts since the previous agent turn (joined by a blank line),
  ``action_text`` = the reply, ``action`` = its parsed action (``<action>..</action>``/``<act>..</act>``,
  else the text after the last ``Action:``), ``format_ok`` = whether one was found, token ids as in
  `trajlake.collect.chat`, ``response_logprobs`` null (unknown for imported data), ``done`` on the last
  turn. Messages after the last agent turn are kept in that turn's ``info.after_last_turn``.
* Episode: env = the ``env`` argument, else ``data_source``, else the ``item_id`` prefix
  (``textcraft_31`` -> ``textcraft``); task_id = ``SPLIT/ITEM`` with ITEM the ``item_id`` (else a hash of
  the first observation): ``train/textcraft_31``, so that files of two splits sharing item ids keep their own;
  success = ``success`` if given, else ``reward``/``score`` > 0, else null; status "ok".
* Task (first row of an item wins): instruction = the first turn's observation (the first human message
  alone is often a generic preamble: the goal comes later), ground_truth = ``reward_model.ground_truth``
  (parsed when it is JSON text), split = the ``split`` argument, else ``extra_info.split`` unless it just
  repeats the env name (as in OpenManus-RL's files), else the file name (``train.parquet`` -> train).
* Ids are deterministic: episode_id = uuid5(file sha256, row index, tokenizer fingerprint), and the default
  run_id hashes the files and tokenizer, so importing the same files again inserts nothing. The
  tokenizer is part of the id because the stored token ids depend on it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
import uuid
from collections.abc import Iterable, Mapping
from os import PathLike
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from trajlake.collect.chat import ChatRenderer, tokenizer_fingerprint
from trajlake.core.clock import utc_now
from trajlake.core.errors import TrajlakeError
from trajlake.core.ids import InvalidIdError, check_id
from trajlake.interop.importers import (
    SUFFIXES,
    ImportResult,
    Limits,
    TrajectoryImportError,
    check_row,
    file_sha256,
    iter_records,
    kind_name,
    progress_bar,
    require_column,
    resolve_files,
    stored_episode_ids,
)
from trajlake.lm.load import load_tokenizer
from trajlake.schemas.records import Episode, Policy, Run, Task
from trajlake.store import lease as run_lease
from trajlake.store import runs

ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "system": "system"}
NAMESPACE = uuid.uuid5(uuid.NAMESPACE_URL, "trajlake/import/agentgym")
_TAG = re.compile(r"<(action|act)>(.*?)</\1>", re.S)
_REACT = re.compile(r"Action\s*:")
_TOKENIZE_BATCH = 64  # rows per tokenizer call: big enough to batch, small enough for a live progress bar


def parse_action(text: str) -> str | None:
    """The action of an agent reply: the last ``<action>``/``<act>`` tag, else what follows the last
    ``Action:`` (AgentGym's ReAct format); None when there is none (a format error)."""
    tags = _TAG.findall(text)
    if tags:
        return tags[-1][1].strip() or None
    marks = list(_REACT.finditer(text))
    return (text[marks[-1].end():].strip() or None) if marks else None


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
    """Import AgentGym-format trajectory files into `lake`; see the module docstring for the mapping.

    `tokenizer_path` is a local tokenizer folder (or hub name, or a loaded tokenizer). Every file is read,
    validated and tokenized before the first write, so a bad file raises `TrajectoryImportError` (naming
    the file, row and field) with the lake unchanged. Each chunk of `chunk_size` episodes is written
    with its turns and tasks in one snapshot; the first chunk also carries the run ("running") and the
    policy, and the run is marked "finished" at the end. Episodes already stored are skipped before
    tokenizing, so an interrupted import resumes where it stopped and a repeated one writes nothing.
    Files are read one row at a time, each row held to `limits` (its size, a text's size, its nesting, finite
    numbers: interop/importers/limits.py) before it is parsed. Returns counts of inserted and skipped rows per
    table.
    """
    if chunk_size < 1:
        raise TrajectoryImportError(f"chunk_size must be at least 1, got {chunk_size}")
    check_labels(run_id=run_id, env=env, split=split)
    files = resolve_files(paths)
    tokenizer, tok_name = tokenizer_path, str(getattr(tokenizer_path, "name_or_path", type(tokenizer_path).__name__))
    if isinstance(tokenizer_path, (str, PathLike)):  # a folder (else a loaded tokenizer)
        tok_name = str(tokenizer_path)
        try:
            tokenizer = load_tokenizer(tokenizer_path)
        except TrajlakeError as e:
            raise TrajectoryImportError(str(e)) from None
    try:
        renderer = ChatRenderer(tokenizer)
    except TrajlakeError as e:
        raise TrajectoryImportError(f"tokenizer {tok_name}: {e}") from None
    tok_fp = tokenizer_fingerprint(tokenizer)
    for f in files:  # a parquet file without conversations is refused from its schema, before any file is read
        if SUFFIXES[f.suffix.lower()] == "parquet":
            require_column(f, "conversations")
    shas = [file_sha256(f) for f in files]
    if run_id is None:
        run_id = runs.hashed_run_id("import-agentgym-", [sorted(shas), tok_fp, policy_id, env, split], 16)

    run_lease.check(lake, run_id)  # another live process importing this run: refused before any row is read
    # Parse and validate every row of every file before anything else: one bad row refuses the import. Rows are
    # read one at a time and only their parsed form is kept.
    episodes: list[dict] = []
    per_file: dict[str, dict[str, int]] = {}
    for path, sha in zip(files, shas, strict=True):
        parsed = [_parse_row(row, path, sha, i, tok_fp, env, split, limits) for i, _, row in iter_records(path, limits)]
        per_file[str(path)] = {"episodes": len(parsed), "turns": sum(len(e["turns"]) for e in parsed)}
        episodes += parsed
    # Episodes already stored (an earlier or interrupted import, or a copy of a file given twice) need
    # no tokens: chunks are atomic, so a stored episode has all its turns.
    seen = stored_episode_ids(lake, [e["id"] for e in episodes])
    new, old = [], []
    for e in episodes:
        (old if e["id"] in seen else new).append(e)
        seen.add(e["id"])
    inserted = dict.fromkeys(("runs", "policies", "tasks", "episodes", "turns"), 0)
    skipped = {**inserted, "episodes": len(old), "turns": sum(len(e["turns"]) for e in old)}
    snapshots: list[int] = []
    # The run's lease (store/lease.py) before tokenizing and writing, once every row was validated (a refused file
    # leaves the lake as it was, lease rows included): one live process per run id. An import with nothing to
    # write (every episode stored, its run finished or never begun) takes none.
    stored = runs.stored(lake, run_id)
    idle = not new and (stored is None or stored.status == "finished")
    with contextlib.nullcontext() if idle else run_lease.acquire(lake, run_id, "import"):
        with progress_bar("tokenizing", len(new), progress) as bar:
            for start in range(0, len(new), _TOKENIZE_BATCH):  # template errors surface here, still unwritten
                _tokenize(renderer, new[start:start + _TOKENIZE_BATCH])
                bar.update(advance=len(new[start:start + _TOKENIZE_BATCH]))
        with progress_bar("writing", len(new), progress) as bar:
            now = utc_now()
            config = {
                "importer": "agentgym", "tokenizer": tok_name, "tokenizer_fingerprint": tok_fp,
                "files": [{"path": str(p.resolve()), "sha256": s, "rows": per_file[str(p)]["episodes"]}
                          for p, s in zip(files, shas, strict=True)],
                "env": env, "split": split, "policy_id": policy_id, "chunk_size": chunk_size,
            }
            run = Run(run_id, "import", config=config, status="running", started_at=now)
            policy = Policy(policy_id, run_id=run_id, created_at=now)
            chunks = [new[i:i + chunk_size] for i in range(0, len(new), chunk_size)]
            tasks_seen: set[str] = set()
            for n, chunk in enumerate(chunks):
                data: dict[str, Any] = {"policies": [policy]} if n == 0 else {}
                tasks = {}
                for e in chunk:  # the first row of an item gives its task row
                    if e["task"].task_id not in tasks_seen:
                        tasks.setdefault(e["task"].task_id, e["task"])
                tasks_seen.update(tasks)
                if tasks:
                    data["tasks"] = list(tasks.values())
                data["episodes"] = [Episode(**e["episode"], run_id=run_id, policy_id=policy_id) for e in chunk]
                data["turns"] = _turns_table(chunk)
                message = f"import: agentgym chunk {n + 1}/{len(chunks)} ({len(chunk)} episodes) run {run_id}"
                if n == 0:  # the run row with the first chunk, so no episode is visible before its run and policy
                    res = runs.begin(lake, run, stage="import", message=message, rows=data)
                else:
                    res = lake.append(data, stage="import", run_id=run_id, message=message)
                for total, counts in ((inserted, res.inserted), (skipped, res.skipped)):
                    for name, k in counts.items():
                        total[name] = total.get(name, 0) + k
                if res.snapshot_id is not None:
                    snapshots.append(res.snapshot_id)
                bar.update(advance=len(chunk))

        stored = runs.stored(lake, run_id)
        if stored is not None and stored.status != "finished":  # a new run, or one an interrupted import left running
            snap = runs.finish(lake, run_id, stage="import")
            if snap is not None:
                snapshots.append(snap)
    return ImportResult(
        run_id=run_id, files=tuple(str(p) for p in files), episodes=len(episodes),
        turns=sum(len(e["turns"]) for e in episodes), inserted=inserted, skipped=skipped,
        snapshots=tuple(snapshots), per_file=per_file,
    )


def _messages(row: Mapping, where: str, limits: Limits) -> tuple[list[dict], list[bool]]:
    """A row's conversation as chat messages, and which of them are agent turns (validated)."""
    if "conversations" not in row:
        raise TrajectoryImportError(f"{where}: no `conversations` field (fields: {', '.join(map(str, row)) or 'none'})")
    conv = row["conversations"]
    if isinstance(conv, str):  # some exports keep the conversation as JSON text (at most the field cap long)
        try:
            conv = json.loads(conv)
        except json.JSONDecodeError:
            raise TrajectoryImportError(f"{where}: `conversations` is text but not JSON") from None
        except RecursionError:
            raise TrajectoryImportError(f"{where}: `conversations` is JSON text nested too deeply") from None
        except ValueError as e:  # an integer of over 4300 digits
            raise TrajectoryImportError(f"{where}: `conversations` is JSON text with an unreadable number ({e})") \
                from None
        check_row(conv, f"{where}: the JSON text of `conversations`", limits)
    if not isinstance(conv, list) or not conv:
        raise TrajectoryImportError(f"{where}: `conversations` must be a non-empty list, got {kind_name(conv)}")
    messages, losses = [], []
    for j, m in enumerate(conv):
        if not isinstance(m, Mapping):
            raise TrajectoryImportError(f"{where} message {j}: expected an object, got {kind_name(m)}")
        frm, value = m.get("from", m.get("role")), m.get("value", m.get("content"))
        if frm is None:
            raise TrajectoryImportError(f"{where} message {j}: no `from` (the speaker)")
        if not isinstance(value, str):
            raise TrajectoryImportError(f"{where} message {j}: no `value` text (got {kind_name(value)})")
        role = ROLES.get(str(frm).lower())
        if role is None:
            raise TrajectoryImportError(f"{where} message {j}: unknown role {frm!r}; known: {', '.join(ROLES)}")
        loss = m.get("loss")
        if loss is not None and not isinstance(loss, bool):
            raise TrajectoryImportError(f"{where} message {j}: `loss` must be true, false or null, got {loss!r}")
        messages.append({"role": role, "content": value})
        losses.append(loss)
    replies = [(m["role"] == "assistant", loss) for m, loss in zip(messages, losses, strict=True)]
    explicit = any(is_reply and loss is True for is_reply, loss in replies)
    agent = [is_reply and (loss is True if explicit else loss is not False) for is_reply, loss in replies]
    if not any(agent):
        raise TrajectoryImportError(f"{where}: no agent turn (no gpt message with loss true or null)")
    if agent[0]:
        raise TrajectoryImportError(f"{where}: starts with an agent message; a turn needs an observation first")
    return messages, agent


def _parse_row(row: Mapping, path: Path, sha: str, index: int, tok_fp: str, env_arg, split_arg,
               limits: Limits) -> dict:
    """Validate one row (already held to `limits` as read) and map it to its task, episode and turns (token ids
    come later)."""
    where = f"{path} row {index}"
    messages, agent = _messages(row, where, limits)
    item_id = row.get("item_id")
    env = env_arg or row.get("data_source") or (_item_prefix(item_id) if item_id else None)
    if not env:
        raise TrajectoryImportError(f"{where}: no `data_source` or `item_id` to tell the env; pass env=")
    turns, obs = [], []
    for j, (m, is_agent) in enumerate(zip(messages, agent, strict=True)):
        if not is_agent:
            if m["role"] != "assistant":  # context replies are in the prompt ids, not the observation text
                obs.append(m["content"])
            continue
        action = parse_action(m["content"])
        info: dict[str, Any] = {"message_index": j}
        if not turns:  # where the episode came from, once per episode
            info.update(source_file=path.name, source_row=index, item_id=item_id)
        turns.append({"observation": "\n\n".join(obs), "action_text": m["content"], "action": action,
                      "format_ok": action is not None, "info": info})
        obs = []
    last = max(j for j, a in enumerate(agent) if a)
    if last + 1 < len(messages):  # the env's last words: no reply followed, so no turn holds them
        turns[-1]["info"]["after_last_turn"] = messages[last + 1:]

    first_obs = turns[0]["observation"]
    extra = row.get("extra_info") if isinstance(row.get("extra_info"), Mapping) else {}
    split = extra.get("split")
    if not isinstance(split, str) or split in (env, row.get("data_source")):  # OpenManus-RL's: the env name
        split = None
    split = split_arg or split or path.stem
    # the split is part of the id: OpenManus-RL's babyai val and train files share item ids, and a task row
    # (its split) is written once, so the file imported first would otherwise decide the other's split
    item = str(item_id) if item_id else f"{env}_{hashlib.sha256(first_obs.encode()).hexdigest()[:12]}"
    task_id = f"{split}/{item}"
    rm = row.get("reward_model") if isinstance(row.get("reward_model"), Mapping) else {}
    ground_truth = _maybe_json(rm.get("ground_truth"))
    check_row(ground_truth, f"{where}: `reward_model.ground_truth`", limits)
    meta = {"data_source": row.get("data_source"), "item_id": item_id, "ability": row.get("ability"),
            "reward_style": rm.get("style"), "index": extra.get("index"), "prompt": row.get("prompt")}
    meta = {k: v for k, v in meta.items() if v is not None}
    reward, success = _outcome(row, where)
    episode_id = str(uuid.uuid5(NAMESPACE, f"{sha}/{index}/{tok_fp}"))
    return {
        "id": episode_id, "messages": messages, "agent": agent, "turns": turns, "where": where,
        "task": Task(task_id, env, split=split, instruction=first_obs,
                     ground_truth=ground_truth, meta=meta or None),
        "episode": dict(episode_id=episode_id, task_id=task_id, env=env, status="ok", success=success,
                        env_reward=reward, num_turns=len(turns)),
    }


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


def _outcome(row: Mapping, where: str) -> tuple[float | None, bool | None]:
    reward = next((row[k] for k in ("reward", "score") if row.get(k) is not None), None)
    if reward is not None and (isinstance(reward, bool) or not isinstance(reward, (int, float))):
        raise TrajectoryImportError(f"{where}: `reward`/`score` must be a number, got {reward!r}")
    success = row.get("success")
    if success is not None and not isinstance(success, bool) and success not in (0, 1):
        raise TrajectoryImportError(f"{where}: `success` must be a boolean, got {success!r}")
    if success is None and reward is not None:
        success = reward > 0
    return (None if reward is None else float(reward)), (None if success is None else bool(success))


def _item_prefix(item_id: Any) -> str:
    """``textcraft_31`` -> ``textcraft``; an id without a numeric suffix is its own prefix."""
    head, _, tail = str(item_id).rpartition("_")
    return head if head and tail.isdigit() else str(item_id)


def _maybe_json(v: Any) -> Any:
    if isinstance(v, str):
        try:
            return json.loads(v)
        except (ValueError, RecursionError):  # not JSON (or too deep or a number too long to read): kept as text
            return v
    return v
