"""Play a remote AgentGym env server over HTTP: the env servers OpenManus-RL trains on.

Each AgentGym environment is registered as an env like any other, `agentgym/<name>` (textcraft, babyai, maze,
wordle, webshop, alfworld, sciworld, sqlgym, weather, movie, todo, academia, sheet; `trajlake envs` lists
them); its `Preset` (agentgym_presets.py) says how that server speaks. A user names the env and the URL:

    env = make_env("agentgym/textcraft", url="http://127.0.0.1:36001")
    task = env.tasks("test", n=1)[0]          # a task is one of the server's data indices (see Preset.splits)
    obs = env.reset(task)                     # creates a remote instance and resets it to the task
    obs, reward, done, info = env.step("Thought: ...\nAction: get 1 oak log")
    env.close()                               # closes the remote instance (also done at the next reset)

`info` has `score` (0..1) when the server sends one, `valid` when the environment says whether the action was
carried out, and, once done, `success` as that environment defines it. `agentgym/trajlake` plays trajlake's own
server (`trajlake serve-env`), which lists its tasks and sends each whole task to /reset.

Before its first /create a client reads the server's greeting (`GET /`, "This is environment TextCraft."):
a server that names another environment is refused (`check_server`), so a BabyAI server is never played as
TextCraft and its wins never stored as failures. A greeting that names no known environment is accepted.

A server that holds a known number of tasks (Preset.size) has its data indices dealt to test, val and train by
a seeded permutation stratified by difficulty (the `stratified-v1` scheme), so its splits are drawn from one
distribution; the env kwarg `split_scheme="contiguous"` plays the old contiguous ranges instead. Each task
records its scheme in `meta["split_scheme"]`; a stored task that records none (an old lake's) is checked
against the contiguous ranges, which is how it was drawn.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import re
import time
from typing import Any

import requests

from trajlake.collect.envs.agentgym_presets import PRESETS, expert_for, get_preset
from trajlake.collect.envs.agentgym_protocol import CONTIGUOUS, Preset, StepReply, expand_profile
from trajlake.collect.envs.http_replies import EnvServerError, clip, read_bounded, reason
from trajlake.collect.envs.registry import register_env
from trajlake.core.errors import TrajlakeError
from trajlake.schemas.records import Task

log = logging.getLogger(__name__)


def task_selector(task: Task) -> int:
    """The integer a data-index server resets to: `task.meta["data_idx"]`, else the task id's last part when it
    is an integer ("agentgym/textcraft/test/17" -> 17), else the task's seed."""
    meta = task.meta if isinstance(task.meta, dict) else {}
    if meta.get("data_idx") is not None:
        return int(meta["data_idx"])
    tail = task.task_id.rsplit("/", 1)[-1]
    if tail.isdigit():
        return int(tail)
    if task.seed is not None:
        return int(task.seed)
    raise ValueError(f"task {task.task_id!r} has no data_idx in meta, no numeric id suffix and no seed")


def task_scheme(task: Task) -> str:
    """The split scheme `task` was drawn by: `task.meta["split_scheme"]`, else CONTIGUOUS (the tasks of lakes
    written before there were schemes record none, and were drawn from the contiguous ranges)."""
    meta = task.meta if isinstance(task.meta, dict) else {}
    return meta.get("split_scheme") or CONTIGUOUS


class AgentGymClient:
    """The Env protocol (tasks, reset, step, close) played against one AgentGym env server.

    Each episode gets its own remote instance: `reset` closes the previous one (where the server can), then
    creates and resets a new one. Connection failures and timeouts are retried `retries` times with exponential
    backoff (`backoff` seconds first); an `{"error": ...}` reply is never retried, nor is a step or a create
    whose reply timed out (the server may already have applied it). Everything that fails is `EnvServerError`.
    """

    name = "agentgym/trajlake"
    default_preset = "trajlake"  # each registered subclass names its own
    description = ""
    action_help = ""
    remote = True  # made with a server URL; `trajlake envs`, the collect config and the env tests read this
    default_template = PRESETS["trajlake"].template
    max_steps: dict[int, int] = {}  # no difficulty levels: the servers have none

    def __init__(self, url: str | None = None, preset: str | Preset | None = None, *, name: str | None = None,
                 split_scheme: str | None = None, timeout: float = 60.0, connect_timeout: float = 5.0,
                 retries: int = 2, backoff: float = 0.2):
        """`split_scheme` names how `tasks` draws a split's data indices ("stratified-v1", "contiguous"; None: the
        preset's default, `Preset.scheme`)."""
        self.url = url.rstrip("/") if url else None
        self.preset = get_preset(preset or self.default_preset)
        self.name = name or self.preset.env_name
        if self.preset.send_task and split_scheme is not None:
            raise ValueError(f"{self.name} lists its tasks itself (GET /tasks); it takes no split_scheme")
        self.split_scheme = "" if self.preset.send_task else self.preset.scheme(split_scheme)
        self.description, self.action_help = self.preset.instructions, self.preset.action_help
        self.timeout, self.connect_timeout = float(timeout), float(connect_timeout)
        self.retries, self.backoff = int(retries), float(backoff)
        self.session = requests.Session()
        self.env_id: Any = None  # the remote instance of the current episode
        self.observation: str | None = None
        self._progress = 0.0  # the last progress of a cumulative-reward server
        self._greeted: str | None = None  # the URL whose greeting check_server accepted

    # ---- the Env protocol ----------------------------------------------------------------------------

    def tasks(self, split: str, n: int | None = None, difficulty: int | None = None) -> list[Task]:
        """`n` tasks of `split`. trajlake's server lists its own (GET /tasks); AgentGym's list none, so a task is
        one of the server's data indices, in the order of `Preset.task_indices` under this client's split scheme
        (id "agentgym/NAME/SPLIT/INDEX", meta `data_idx` and, where the server has a size, `split_scheme`)."""
        if self.preset.send_task:
            return self._listed_tasks(split, n, difficulty)
        self.preset.split_range(split)  # an unknown split is refused first, naming the valid ones
        if difficulty is not None:
            raise ValueError(f"{self.name} has no difficulty levels; leave difficulty unset")
        scheme = {"split_scheme": self.split_scheme} if self.preset.size else {}  # sizeless: contiguous only
        # where the preset knows its data's difficulty (TextCraft's crafting depth), each task says its own: the
        # evaluation's per-difficulty rows and a curriculum selector (train/queries/curriculum.sql) read it
        depth = expand_profile(self.preset.difficulty_profile) if self.preset.difficulty_profile else None
        return [Task(task_id=f"{self.name}/{split}/{i}", env=self.name, split=split, seed=i,
                     meta={"data_idx": i, **scheme, **({"difficulty": depth[i]} if depth else {})})
                for i in self.preset.task_indices(split, n, self.split_scheme)]

    @property
    def difficulties(self) -> tuple[int, ...]:
        """No difficulty levels: AgentGym's servers have none."""
        return ()

    def split_size(self, split: str) -> int | None:
        """How many tasks `split` holds (None: no end, the server's tasks are seeds or it lists its own)."""
        return None if self.preset.send_task else self.preset.split_size(split)

    def check_server(self) -> None:
        """Refuse (EnvServerError, one line) a server whose greeting names another environment and not this one.

        Done once per URL, before anything is played or stored (collect's setup calls it): a server of another
        environment otherwise answers this protocol with games it scores its own way. A greeting that names no
        known environment ("ok", or no greeting at all) is accepted: servers that say little stay playable. An
        unreachable server fails as every request does, after the retries.
        """
        if self._greeted is not None and self._greeted == self.url:
            return
        url = self._base() + "/"
        r = self._send("GET", url)
        greeting = _text(r) if r.status_code == 200 else ""
        own = self.preset.title
        if not greets_as(greeting, own):
            others = [p for p in named_presets(greeting) if p.title.lower() != own.lower()]
            if others:
                instead = " or ".join(f"--env {p.env_name}" for p in others)
                raise EnvServerError(f"env {self.name} wants a {own} server, but the server at {self.url} greets "
                                     f"{clip(' '.join(greeting.split()), 80)!r}: pass {instead} instead "
                                     f"(or the --env-url of a {own} server)", r.status_code)
            log.debug("the server at %s greets %r, naming no known environment: playing it as %s",
                      self.url, clip(greeting, 80), self.name)
        self._greeted = self.url

    def reset(self, task: Task) -> str:
        """Close the last episode's instance, create one and reset it to `task`; the first observation."""
        p = self.preset
        self._release()
        self._progress = 0.0
        selector = None if p.send_task else task_selector(task)
        if selector is not None:  # refused before anything reaches the server, which may wrap the index
            p.check_index(selector, task.split, task_scheme(task))
        body = dict(p.create_body) if p.create_body is not None else None
        if p.create_task_field:
            body = {**(body or {}), p.create_task_field: selector}
        created = self._request("POST", "create", body, idempotent=False)  # a lost reply must not make two
        self.env_id = self._created_id(created)
        body = {p.id_field: self.env_id, **dict(p.reset_extra)}
        if p.send_task:
            body["task"] = dataclasses.asdict(task)
        else:
            body[p.reset_field] = selector
        reply = self._request("POST", "reset", body)  # resetting twice gives the same start: safe to retry
        obs = self.observe() if p.first_observation == "observe" else self._obs(reply, "reset")
        parts = [p.intro, _field(reply, p.reset_prefix_key), obs]
        if p.reset_suffix_key and isinstance(reply, dict) and isinstance(reply.get(p.reset_suffix_key), list):
            parts.append("Available actions: " + ", ".join(map(str, reply[p.reset_suffix_key])))
        if p.word_list_route:
            words = self._request("GET", p.word_list_route, params={p.id_field: self.env_id})
            parts.append("Valid words: " + " ".join(map(str, words if isinstance(words, list) else [words])))
        self.observation = "\n".join(str(x) for x in parts if x)
        return self.observation

    def step(self, action: str) -> tuple[str, float, bool, dict[str, Any]]:
        """Send one action (cleaned as the environment's own client does); (observation, reward, done, info)."""
        if self.env_id is None:
            raise RuntimeError(f"{self.name}: call reset(task) before step()")
        p = self.preset
        sent = p.clean_action(action if isinstance(action, str) else "")
        reply = self._request("POST", "step", {p.id_field: self.env_id, "action": sent}, idempotent=False)
        if not isinstance(reply, dict):
            raise EnvServerError(f"POST {self._url('step')}: expected an object, got {clip(reply)}", 200)
        obs = self._obs(reply, "step")
        reward, done = _number(reply.get("reward"), "reward", self._url("step")), bool(reply.get("done", False))
        raw = reply.get("info")
        info = dict(raw) if isinstance(raw, dict) else ({} if raw is None else {"server_info": raw})
        score = None
        if p.cumulative_reward:  # progress so far: the step's reward is its increase
            score, reward = reward, reward - self._progress
            self._progress = score
            info["score"] = score
        elif p.score_key and reply.get(p.score_key) is not None:
            score = _number(reply[p.score_key], p.score_key, self._url("step")) / p.score_scale
            info["score"] = score
        elif isinstance(info.get("score"), (int, float)):  # trajlake's server puts a 0..1 score in info
            score = float(info["score"])
        valid = p.is_valid(obs)
        if valid is not None:
            info.setdefault("valid", valid)
        if isinstance(action, str) and sent != action:
            info["sent_action"] = sent
        if done and "success" not in info:
            info["success"] = p.success(StepReply(reward, done, score, obs))
        self.observation = obs
        return obs, reward, done, info

    def observe(self) -> str:
        """The current observation, asked from the server (GET /observation)."""
        if self.env_id is None:
            raise RuntimeError(f"{self.name}: call reset(task) before observe()")
        return self._obs(self._request("GET", "observation", params={self.preset.id_field: self.env_id}),
                         "observation")

    def close(self) -> None:
        """Close the remote instance, if any (best effort: a dead server has nothing left to close)."""
        self._release()

    def expert(self):
        """The scripted expert of this environment, playing from the observations alone (no ground truth)."""
        return expert_for(self.preset)

    # ---- HTTP ----------------------------------------------------------------------------------------

    def _base(self) -> str:
        if not self.url:
            raise TrajlakeError(f"env {self.name} plays an AgentGym server: give its URL (--env-url URL)")
        return self.url

    def _url(self, route: str) -> str:
        self._base()
        prefix = self.preset.prefix.strip("/")
        # LMRL-Gym's README gives the maze server's URL with its prefix (http://host:port/maze): accept both
        if prefix and not self.url.endswith("/" + prefix):
            return f"{self.url}/{prefix}/{route}"
        return f"{self.url}/{route}"

    def _request(self, method: str, route: str, body: dict | None = None, params: dict | None = None, *,
                 idempotent: bool = True, retries: int | None = None) -> Any:
        url = self._url(route)
        r = self._send(method, url, body, params, idempotent=idempotent, retries=retries)
        if r.status_code != 200:
            raise EnvServerError(f"{method} {url}: HTTP {r.status_code}: {clip(r.text)}", r.status_code)
        try:
            data = r.json()
        except ValueError:
            raise EnvServerError(f"{method} {url}: reply is not JSON: {clip(r.text)}", 200) from None
        except RecursionError:  # json's parser recurses: a reply nested thousands deep
            raise EnvServerError(f"{method} {url}: reply nests too deep to be an env's reply", 200) from None
        if isinstance(data, dict) and "error" in data:
            raise EnvServerError(f"{method} {url}: server error: {data['error']}", 200)
        return data

    def _send(self, method: str, url: str, body: dict | None = None, params: dict | None = None, *,
              idempotent: bool = True, retries: int | None = None) -> requests.Response:
        """The reply to one request, whatever its status, retrying what is safe to send again (see the class)."""
        attempts = 1 + (self.retries if retries is None else retries)
        for attempt in range(attempts):
            try:
                r = self.session.request(method, url, json=body, params=params, stream=True,
                                         timeout=(self.connect_timeout, self.timeout))
            except requests.ReadTimeout as e:
                why = f"no reply within {self.timeout:g}s"
                if not idempotent:
                    raise EnvServerError(f"{method} {url}: {why}; not retried, the server may have applied it") from e
            except requests.ConnectionError as e:  # refused, reset, or ConnectTimeout: safe to send again
                why = f"cannot connect ({reason(e)})"
            except requests.RequestException as e:
                raise EnvServerError(f"{method} {url}: {type(e).__name__}: {reason(e)}") from e
            else:
                read_bounded(r, method, url, self.timeout)  # the server answered: never sent again
                if r.status_code != 503:
                    return r
                why = "HTTP 503 (busy)"  # WebShop's server answers 503 before it does any work: ask again
            if attempt + 1 < attempts:
                time.sleep(self.backoff * 2**attempt)
        raise EnvServerError(f"{method} {url}: {why} (after {attempts} attempts)")

    def _listed_tasks(self, split: str, n: int | None, difficulty: int | None) -> list[Task]:
        params = {"split": split, "n": n, "difficulty": difficulty}
        reply = self._request("GET", "tasks", params={k: v for k, v in params.items() if v is not None})
        if not isinstance(reply, dict) or not isinstance(reply.get("tasks"), list):
            raise EnvServerError(f"GET {self._url('tasks')}: expected {{'tasks': [...]}}, got {clip(reply)}", 200)
        return [Task(**t) for t in reply["tasks"]]

    def _created_id(self, reply: Any) -> Any:
        # Accept both shapes whatever the preset says: a bare id is unambiguous, and so is {"id": N}.
        if isinstance(reply, (int, str)) and not isinstance(reply, bool):
            return reply
        if isinstance(reply, dict):
            for key in (self.preset.id_field, "id", "env_idx"):
                if key in reply:
                    return reply[key]
        raise EnvServerError(f"POST {self._url('create')}: no instance id in {clip(reply)}", 200)

    def _obs(self, reply: Any, route: str) -> str:
        if isinstance(reply, str):  # a bare observation (LMRL-Gym's and WebShop's GET /observation)
            return reply
        if isinstance(reply, list) and reply:  # WebShop's /reset replies [observation, None]
            return str(reply[0])
        if isinstance(reply, dict):
            for key in (self.preset.obs_key, "observation", "state"):
                if key in reply:
                    return reply[key] if isinstance(reply[key], str) else str(reply[key])
        raise EnvServerError(f"{self._url(route)}: no {self.preset.obs_key!r} in reply {clip(reply)}", 200)

    def _release(self) -> None:
        env_id, self.env_id = self.env_id, None
        if env_id is None or not self.preset.can_close:
            return
        try:
            self._request("POST", "close", {self.preset.id_field: env_id}, retries=0)
        except EnvServerError as e:
            log.debug("closing remote env %s failed: %s", env_id, e)


def register() -> list[str]:
    """Register every preset as an env `agentgym/NAME` (idempotent); returns the names."""
    for preset in PRESETS.values():
        attrs = {"name": preset.env_name, "default_preset": preset.name, "expert_aliases": (preset.name,),
                 "description": preset.instructions,
                 "action_help": preset.action_help, "splits": tuple(preset.splits),
                 "split_sizes": {} if preset.send_task else {s: preset.split_size(s) for s in preset.splits},
                 "split_scheme": "" if preset.send_task else preset.scheme(None),
                 "split_difficulty": {} if preset.send_task else preset.split_difficulty(preset.scheme(None)),
                 "default_template": preset.template,
                 "__doc__": f"AgentGym's {preset.title} server ({preset.name})."}
        register_env(type(f"AgentGym_{preset.name}", (AgentGymClient,), attrs))
    return [p.env_name for p in PRESETS.values()]


def resolve_env_name(env: str, url: str | None, preset: str | None = None) -> str:
    """The env a user means: `agentgym` alone is the AgentGym server at `url`, named by `preset` or told by its
    greeting (`agentgym/NAME`); any other name is itself. An AgentGym env without a URL is refused here."""
    if env == "agentgym":
        if not url:
            raise TrajlakeError("--env agentgym needs --env-url URL of an AgentGym env server")
        return f"agentgym/{get_preset(preset).name}" if preset else f"agentgym/{detect_preset(url)}"
    if preset:
        raise TrajlakeError(f"--env-variant is for --env agentgym; {env} names its environment already")
    return env


def detect_preset(url: str, timeout: float = 5.0) -> str:
    """The preset of the server at `url`, from its greeting (`GET /`: "This is environment TextCraft.")."""
    try:
        r = requests.get(url.rstrip("/") + "/", timeout=timeout, stream=True)
        read_bounded(r, "GET", url, timeout)
        greeting = r.text if r.status_code == 200 else ""
    except requests.RequestException as e:
        raise EnvServerError(f"GET {url}: cannot connect ({reason(e)})") from e
    # LMRL-Gym serves maze and wordle alike, and several servers just say "ok": those must be named
    titles = [p.title for p in PRESETS.values()]
    for preset in named_presets(greeting):
        if titles.count(preset.title) == 1:
            return preset.name
    raise TrajlakeError(f"cannot tell which AgentGym environment serves {url} (it greets {clip(greeting, 80)!r}); "
                        f"name it: --env agentgym/NAME with NAME one of {', '.join(sorted(PRESETS))}")


def greets_as(greeting: str, title: str) -> bool:
    """Whether `greeting` names the environment `title`: as a whole word, in any case ("This is environment
    TextCraft." names TextCraft; "TextCraftX" does not)."""
    return re.search(rf"\b{re.escape(title)}\b", greeting, re.I) is not None


def named_presets(greeting: str) -> list[Preset]:
    """The presets whose title `greeting` names, in PRESETS order (maze and wordle share "LMRL-Gym": both)."""
    return [p for p in PRESETS.values() if greets_as(greeting, p.title)]


def _text(r: requests.Response) -> str:
    """A reply's text, unquoted when it is a JSON string (FastAPI sends `"This is environment TextCraft."`)."""
    try:
        data = r.json()
    except (ValueError, RecursionError):
        return r.text
    return data if isinstance(data, str) else r.text


def _field(reply: Any, key: str | None) -> Any:
    return reply.get(key) if key and isinstance(reply, dict) else None


def _number(value: Any, key: str, url: str) -> float:
    """A reply's number; one that is not finite (JSON NaN, Infinity, 1e999, an integer past a float's range) is
    refused like any malformed reply: stored as a reward, it would turn every mean and advantage over it NaN."""
    if value is None:
        return 0.0
    try:
        number = float(value)
    except (TypeError, ValueError, OverflowError):
        raise EnvServerError(f"{url}: {key} is not a number: {clip(value)}", 200) from None
    if not math.isfinite(number):
        raise EnvServerError(f"{url}: {key} is {number}, not a finite number", 200)
    return number
