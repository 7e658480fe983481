"""One row of an OpenManus-RL / AgentGym trajectory file, validated and mapped to a task, an episode and its turns
(token ids are added later, a batch at a time: agentgym.py).

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

import hashlib
import json
import re
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from trajlake.interop.importers.common import kind_name
from trajlake.interop.importers.limits import Limits, TrajectoryImportError, check_row
from trajlake.schemas.records import Task

ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "system": "system"}
NAMESPACE = uuid.uuid5(uuid.NAMESPACE_URL, "trajlake/import/agentgym")
_TAG = re.compile(r"<(action|act)>(.*?)</\1>", re.S)
_REACT = re.compile(r"Action\s*:")


def parse_action(text: str) -> str | None:
    """The action of an agent reply: the last ``<action>``/``<act>`` tag, else what follows the last
    ``Action:`` (AgentGym's ReAct format); None when there is none (a format error)."""
    tags = _TAG.findall(text)
    if tags:
        return tags[-1][1].strip() or None
    marks = list(_REACT.finditer(text))
    return (text[marks[-1].end():].strip() or None) if marks else None


def messages_of(row: Mapping, where: str, limits: Limits) -> tuple[list[dict], list[bool]]:
    """A row's conversation as chat messages, and which of them are agent turns (validated)."""
    conv = _conversation(row, where, limits)
    messages, losses = [], []
    for j, m in enumerate(conv):
        message, loss = _message(m, f"{where} message {j}")
        messages.append(message)
        losses.append(loss)
    replies = [(m["role"] == "assistant", loss) for m, loss in zip(messages, losses, strict=True)]
    explicit = any(is_reply and loss is True for is_reply, loss in replies)
    agent = [is_reply and (loss is True if explicit else loss is not False) for is_reply, loss in replies]
    if not any(agent):
        raise TrajectoryImportError(f"{where}: no agent turn (no gpt message with loss true or null)")
    if agent[0]:
        raise TrajectoryImportError(f"{where}: starts with an agent message; a turn needs an observation first")
    return messages, agent


def _conversation(row: Mapping, where: str, limits: Limits) -> list:
    """The row's `conversations` list (parsed and held to `limits` where an export keeps it as JSON text)."""
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
    return conv


def _message(m: Any, where: str) -> tuple[dict, bool | None]:
    """One conversation entry as a chat message, and its `loss` flag (None when unset)."""
    if not isinstance(m, Mapping):
        raise TrajectoryImportError(f"{where}: expected an object, got {kind_name(m)}")
    frm, value = m.get("from", m.get("role")), m.get("value", m.get("content"))
    if frm is None:
        raise TrajectoryImportError(f"{where}: no `from` (the speaker)")
    if not isinstance(value, str):
        raise TrajectoryImportError(f"{where}: no `value` text (got {kind_name(value)})")
    role = ROLES.get(str(frm).lower())
    if role is None:
        raise TrajectoryImportError(f"{where}: unknown role {frm!r}; known: {', '.join(ROLES)}")
    loss = m.get("loss")
    if loss is not None and not isinstance(loss, bool):
        raise TrajectoryImportError(f"{where}: `loss` must be true, false or null, got {loss!r}")
    return {"role": role, "content": value}, loss


def _turns(messages: list[dict], agent: list[bool], source: dict[str, Any]) -> list[dict]:
    """The episode's turns: each agent message with the observations since the last one; the first turn's info
    says where the episode came from (`source`), the last's holds the env's words after it, if any."""
    turns, obs = [], []
    for j, (m, is_agent) in enumerate(zip(messages, agent, strict=True)):
        if not is_agent:
            if m["role"] != "assistant":  # context replies are in the prompt ids, not the observation text
                obs.append(m["content"])
            continue
        action = parse_action(m["content"])
        info: dict[str, Any] = {"message_index": j, **({} if turns else source)}  # the source once per episode
        turns.append({"observation": "\n\n".join(obs), "action_text": m["content"], "action": action,
                      "format_ok": action is not None, "info": info})
        obs = []
    last = max(j for j, a in enumerate(agent) if a)
    if last + 1 < len(messages):  # the env's last words: no reply followed, so no turn holds them
        turns[-1]["info"]["after_last_turn"] = messages[last + 1:]
    return turns


def parse_row(row: Mapping, path: Path, sha: str, index: int, tok_fp: str, env_arg, split_arg,
               limits: Limits) -> dict:
    """Validate one row (already held to `limits` as read) and map it to its task, episode and turns (token ids
    come later)."""
    where = f"{path} row {index}"
    messages, agent = messages_of(row, where, limits)
    item_id = row.get("item_id")
    env = env_arg or row.get("data_source") or (item_prefix(item_id) if item_id else None)
    if not env:
        raise TrajectoryImportError(f"{where}: no `data_source` or `item_id` to tell the env; pass env=")
    turns = _turns(messages, agent, {"source_file": path.name, "source_row": index, "item_id": item_id})

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
    ground_truth = maybe_json(rm.get("ground_truth"))
    check_row(ground_truth, f"{where}: `reward_model.ground_truth`", limits)
    meta = {"data_source": row.get("data_source"), "item_id": item_id, "ability": row.get("ability"),
            "reward_style": rm.get("style"), "index": extra.get("index"), "prompt": row.get("prompt")}
    meta = {k: v for k, v in meta.items() if v is not None}
    reward, success = outcome(row, where)
    episode_id = str(uuid.uuid5(NAMESPACE, f"{sha}/{index}/{tok_fp}"))
    return {
        "id": episode_id, "messages": messages, "agent": agent, "turns": turns, "where": where,
        "task": Task(task_id, env, split=split, instruction=first_obs,
                     ground_truth=ground_truth, meta=meta or None),
        "episode": dict(episode_id=episode_id, task_id=task_id, env=env, status="ok", success=success,
                        env_reward=reward, num_turns=len(turns)),
    }


def outcome(row: Mapping, where: str) -> tuple[float | None, bool | None]:
    reward = next((row[k] for k in ("reward", "score") if row.get(k) is not None), None)
    if reward is not None and (isinstance(reward, bool) or not isinstance(reward, (int, float))):
        raise TrajectoryImportError(f"{where}: `reward`/`score` must be a number, got {reward!r}")
    success = row.get("success")
    if success is not None and not isinstance(success, bool) and success not in (0, 1):
        raise TrajectoryImportError(f"{where}: `success` must be a boolean, got {success!r}")
    if success is None and reward is not None:
        success = reward > 0
    return (None if reward is None else float(reward)), (None if success is None else bool(success))


def item_prefix(item_id: Any) -> str:
    """``textcraft_31`` -> ``textcraft``; an id without a numeric suffix is its own prefix."""
    head, _, tail = str(item_id).rpartition("_")
    return head if head and tail.isdigit() else str(item_id)


def maybe_json(v: Any) -> Any:
    if isinstance(v, str):
        try:
            return json.loads(v)
        except (ValueError, RecursionError):  # not JSON (or too deep or a number too long to read): kept as text
            return v
    return v
