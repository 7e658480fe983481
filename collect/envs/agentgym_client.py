"""An env that plays a remote AgentGym env server over HTTP: the protocol OpenManus-RL uses.

AgentGym's env servers speak a small JSON protocol: POST /create -> an instance id; POST /reset with the id
and a task selector -> the first observation; POST /step {id, action} -> observation, reward, done (score and
info on some); GET /observation?id=N; POST /close {id}. They disagree on details (the id's field name, the
selector, the observation key, a route prefix, bare-int replies), so each server is described by a `Variant`.

    client = AgentGymClient("http://127.0.0.1:36001", variant="textcraft")
    obs = client.reset(task)                  # selector: task.meta["data_idx"], else the task id's last part
    obs, reward, done, info = client.step("get 1 oak log")
    client.close()                            # closes the remote instance (also done at the next reset)

The presets follow the request and reply shapes of AgentGym's published env clients (agentenv/envs/*.py) and
servers; they are tested only against trajlake's own server (`agentgym_server`) configured to mimic each shape,
never against the real AgentGym servers.

The client is not in the env registry: the registry's names are the built-in envs that every env test plays
with no arguments, and a client needs a URL. `make_remote_env(url, variant)` is its factory.
"""

from __future__ import annotations

import dataclasses
import logging
import re
import time
from dataclasses import dataclass
from typing import Any

import requests

from trajlake.schemas.records import Task
from trajlake.store.errors import TrajlakeError

log = logging.getLogger(__name__)


class EnvServerError(TrajlakeError):
    """An env server replied with an error, an unreadable reply, or could not be reached in time.

    The message names the method and URL and says what happened. `status` is the HTTP status when there was a
    reply (AgentGym servers send their errors as HTTP 200 `{"error": ...}`), None when there was none.
    """

    def __init__(self, message: str, status: int | None = None):
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Variant:
    """How one AgentGym server shapes its requests and replies."""

    name: str
    id_field: str = "id"  # the instance id's field in requests (and in the /create reply): "id" or "env_idx"
    reset_field: str = "data_idx"  # the task selector sent to /reset: data_idx, game, seed, item_id, session_id
    prefix: str = ""  # route prefix, e.g. "maze" for /maze/create on LMRL-Gym's server
    obs_key: str = "observation"  # the observation's key in replies: "observation" or "state"
    create_returns_bare_int: bool = False  # /create replies `N`, not `{"id": N}`
    send_task: bool = False  # /reset gets the whole task as `"task": {...}` (trajlake's server only)
    reset_extra: tuple[tuple[str, Any], ...] = ()  # constant fields added to /reset, e.g. ALFWorld's world_type
    reset_prefix_key: str | None = None  # a reset reply field put before the observation (SciWorld's task)
    score_scale: float = 1.0  # the server's score for full success (SciWorld scores 0..100)
    can_close: bool = True  # the server has POST /close (LMRL-Gym's, BabyAI's, SciWorld's, SQLGym's have not)


PRESETS: dict[str, Variant] = {v.name: v for v in [
    Variant("trajlake", send_task=True),
    Variant("textcraft"),
    Variant("babyai", can_close=False),
    Variant("sciworld", reset_prefix_key="task_description", score_scale=100.0, can_close=False),
    Variant("alfworld", reset_field="game", reset_extra=(("world_type", "Text"),)),
    Variant("maze", reset_field="game", prefix="maze", can_close=False),
    Variant("wordle", reset_field="seed", prefix="wordle", can_close=False),
    Variant("webshop", id_field="env_idx", reset_field="session_id", obs_key="state",
            create_returns_bare_int=True),
    Variant("sqlgym", id_field="env_idx", reset_field="item_id", obs_key="state", create_returns_bare_int=True,
            can_close=False),
]}


def get_variant(variant: str | Variant) -> Variant:
    """A preset by name, or `variant` itself."""
    if isinstance(variant, Variant):
        return variant
    try:
        return PRESETS[variant]
    except KeyError:
        raise ValueError(f"unknown AgentGym variant {variant!r}; presets: {', '.join(sorted(PRESETS))}") from None


def task_selector(task: Task) -> int:
    """The integer a data-index server resets to: `task.meta["data_idx"]`, else the task id's last part when it
    is an integer ("textcraft/test/17" -> 17), else the task's seed."""
    meta = task.meta if isinstance(task.meta, dict) else {}
    if meta.get("data_idx") is not None:
        return int(meta["data_idx"])
    tail = task.task_id.rsplit("/", 1)[-1]
    if tail.isdigit():
        return int(tail)
    if task.seed is not None:
        return int(task.seed)
    raise ValueError(f"task {task.task_id!r} has no data_idx in meta, no numeric id suffix and no seed")


class AgentGymClient:
    """The Env protocol (tasks, reset, step, close) played against a remote AgentGym-style env server.

    Each episode gets its own remote instance: `reset` closes the previous one, then creates and resets a new one.
    Connection failures and timeouts are retried `retries` times with exponential backoff (`backoff` seconds
    first); an `{"error": ...}` reply is never retried. A step whose reply timed out is not retried either: the
    server may already have applied it. Everything that fails ends as `EnvServerError`.
    """

    description = "A remote AgentGym env server."
    action_help = ""

    def __init__(self, url: str, variant: str | Variant = "trajlake", *, name: str | None = None,
                 timeout: float = 30.0, connect_timeout: float = 5.0, retries: int = 2, backoff: float = 0.2):
        self.url = url.rstrip("/")
        self.variant = get_variant(variant)
        self.name = name or self.variant.name
        self.timeout, self.connect_timeout = float(timeout), float(connect_timeout)
        self.retries, self.backoff = int(retries), float(backoff)
        self.session = requests.Session()
        self.env_id: Any = None  # the remote instance of the current episode
        self.observation: str | None = None

    # ---- the Env protocol ----------------------------------------------------------------------------

    def tasks(self, split: str, n: int | None = None, difficulty: int | None = None) -> list[Task]:
        """The server's tasks when it lists them (trajlake's server, GET /tasks), each with `meta["data_idx"]`.

        AgentGym's servers list none: then `n` (default 100) placeholder tasks "NAME/SPLIT/i" with data_idx i are
        made up, and `difficulty` must be None.
        """
        params = {"split": split, "n": n, "difficulty": difficulty}
        try:
            reply = self._request("GET", "tasks", params={k: v for k, v in params.items() if v is not None})
        except EnvServerError as e:
            if e.status != 404:
                raise
            if difficulty is not None:
                raise ValueError(f"{self.url} lists no tasks, so it has no difficulty levels") from None
            return [Task(task_id=f"{self.name}/{split}/{i}", env=self.name, split=split, seed=i,
                         meta={"data_idx": i}) for i in range(100 if n is None else n)]
        if not isinstance(reply, dict) or not isinstance(reply.get("tasks"), list):
            raise EnvServerError(f"GET {self._url('tasks')}: expected {{'tasks': [...]}}, got {_clip(reply)}", 200)
        return [Task(**t) for t in reply["tasks"]]

    def reset(self, task: Task) -> str:
        """Close the last episode's instance, create one and reset it to `task`; the first observation."""
        self._release()
        created = self._request("POST", "create", idempotent=False)  # a lost reply must not make two instances
        self.env_id = self._created_id(created)
        body = {self.variant.id_field: self.env_id, **dict(self.variant.reset_extra)}
        if self.variant.send_task:
            body["task"] = dataclasses.asdict(task)
        else:
            body[self.variant.reset_field] = task_selector(task)
        reply = self._request("POST", "reset", body)  # resetting twice gives the same start: safe to retry
        self.observation = self._obs(reply, "reset")
        return self.observation

    def step(self, action: str) -> tuple[str, float, bool, dict[str, Any]]:
        """Send one action; (observation, reward, done, info).

        info is the server's info plus `score` (the reply's score over `score_scale`) when the server gives one,
        `valid` (True unless the server says otherwise) and, at the end, `success` (from info, else score or
        reward reaching 1).
        """
        if self.env_id is None:
            raise RuntimeError(f"{self.name}: call reset(task) before step()")
        reply = self._request("POST", "step", {self.variant.id_field: self.env_id, "action": action},
                              idempotent=False)
        obs = self._obs(reply, "step")
        if not isinstance(reply, dict):
            raise EnvServerError(f"POST {self._url('step')}: expected an object, got {_clip(reply)}", 200)
        reward, done = float(reply.get("reward") or 0.0), bool(reply.get("done", False))
        raw = reply.get("info")
        info = dict(raw) if isinstance(raw, dict) else ({} if raw is None else {"server_info": raw})
        if reply.get("score") is not None:
            info.setdefault("score", float(reply["score"]) / self.variant.score_scale)
        info.setdefault("valid", True)
        if done and "success" not in info:
            info["success"] = float(info.get("score", reward)) >= 1.0
        self.observation = obs
        return obs, reward, done, info

    def observe(self) -> str:
        """The current observation, asked from the server (GET /observation)."""
        if self.env_id is None:
            raise RuntimeError(f"{self.name}: call reset(task) before observe()")
        return self._obs(self._request("GET", "observation", params={self.variant.id_field: self.env_id}),
                         "observation")

    def close(self) -> None:
        """Close the remote instance, if any (best effort: a dead server has nothing left to close)."""
        self._release()

    # ---- HTTP ----------------------------------------------------------------------------------------

    def _url(self, route: str) -> str:
        prefix = self.variant.prefix.strip("/")
        return f"{self.url}/{prefix}/{route}" if prefix else f"{self.url}/{route}"

    def _request(self, method: str, route: str, body: dict | None = None, params: dict | None = None, *,
                 idempotent: bool = True, retries: int | None = None) -> Any:
        url = self._url(route)
        attempts = 1 + (self.retries if retries is None else retries)
        for attempt in range(attempts):
            try:
                r = self.session.request(method, url, json=body, params=params,
                                         timeout=(self.connect_timeout, self.timeout))
                break
            except requests.ReadTimeout as e:
                why = f"no reply within {self.timeout:g}s"
                if not idempotent:
                    raise EnvServerError(f"{method} {url}: {why}; not retried, the server may have applied it") from e
            except requests.ConnectionError as e:  # refused, reset, or ConnectTimeout: safe to send again
                why = f"cannot connect ({_reason(e)})"
            except requests.RequestException as e:
                raise EnvServerError(f"{method} {url}: {type(e).__name__}: {_reason(e)}") from e
            if attempt + 1 < attempts:
                time.sleep(self.backoff * 2**attempt)
        else:
            raise EnvServerError(f"{method} {url}: {why} (after {attempts} attempts)")
        if r.status_code != 200:
            raise EnvServerError(f"{method} {url}: HTTP {r.status_code}: {_clip(r.text)}", r.status_code)
        try:
            data = r.json()
        except ValueError:
            raise EnvServerError(f"{method} {url}: reply is not JSON: {_clip(r.text)}", 200) from None
        if isinstance(data, dict) and "error" in data:
            raise EnvServerError(f"{method} {url}: server error: {data['error']}", 200)
        return data

    def _created_id(self, reply: Any) -> Any:
        # Accept both shapes whatever the variant says: a bare id is unambiguous, and so is {"id": N}.
        if isinstance(reply, (int, str)) and not isinstance(reply, bool):
            return reply
        if isinstance(reply, dict):
            for key in (self.variant.id_field, "id", "env_idx"):
                if key in reply:
                    return reply[key]
        raise EnvServerError(f"POST {self._url('create')}: no instance id in {_clip(reply)}", 200)

    def _obs(self, reply: Any, route: str) -> str:
        if isinstance(reply, str):  # LMRL-Gym's and WebShop's GET /observation
            return reply
        if isinstance(reply, list) and reply:  # WebShop's /reset replies [observation, None]
            return str(reply[0])
        if isinstance(reply, dict):
            for key in (self.variant.obs_key, "observation", "state"):
                if key in reply:
                    obs = reply[key] if isinstance(reply[key], str) else str(reply[key])
                    head = reply.get(self.variant.reset_prefix_key or "") if route == "reset" else None
                    return f"{head}\n{obs}" if head else obs
        raise EnvServerError(f"{self._url(route)}: no {self.variant.obs_key!r} in reply {_clip(reply)}", 200)

    def _release(self) -> None:
        env_id, self.env_id = self.env_id, None
        if env_id is None or not self.variant.can_close:
            return
        try:
            self._request("POST", "close", {self.variant.id_field: env_id}, retries=0)
        except EnvServerError as e:
            log.debug("closing remote env %s failed: %s", env_id, e)


def make_remote_env(url: str, variant: str | Variant = "trajlake", **kwargs: Any) -> AgentGymClient:
    """An `AgentGymClient` for `url` (kwargs: name, timeout, connect_timeout, retries, backoff)."""
    return AgentGymClient(url, variant, **kwargs)


def _reason(e: Exception) -> str:
    """The useful tail of a requests error ("[Errno 111] Connection refused"), not its whole chain."""
    text = str(e)
    m = re.search(r"\[Errno -?\d+\][^'\")]*", text) or re.search(r"(Remote\w+|Connection \w+)[^'\")]*", text)
    return m.group(0).strip() if m else _clip(text)


def _clip(value: Any, n: int = 200) -> str:
    text = value if isinstance(value, str) else repr(value)
    return text if len(text) <= n else text[:n] + "..."
