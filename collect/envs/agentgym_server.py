"""Serve any registered trajlake env over AgentGym's env-server HTTP protocol (stdlib http.server only).

Routes (also under /PREFIX/... when a prefix is given, as LMRL-Gym's /maze/create):

    GET  /                             a greeting string
    POST /create                       {"id": N}  (a bare N, or {"env_idx": N}, as the preset says)
    POST /reset   {id, data_idx}       {"observation": ..., "task_id": ...}; data_idx indexes env.tasks(split)
    POST /reset   {id, task: {...}}    the same, for exactly this task (a stored Task's fields)
    POST /step    {id, action}         {"observation", "reward", "done", "info", "score" once the env gives it}
    GET  /observation?id=N             {"observation": ...}
    POST /close   {id}                 {"closed": true}
    GET  /list_envs                    the live instance ids
    GET  /tasks?split=&n=&difficulty=  {"tasks": [...]}, each with meta["data_idx"] (trajlake's addition)

Like AgentGym's servers, every error (unknown id or route, bad JSON, a missing field, a step after the episode
ended) is an HTTP 200 reply `{"error": "..."}`.

With `preset` naming an AgentGym environment (`agentgym_presets`), the server imitates that environment's wire
shape with a trajlake env's game, so the client's handling of every AgentGym shape is tested without the real
servers: its greeting, the id field and reset selector, a task index in the /create body, the observation key,
the /create reply's shape, the reset reply's extra fields and list route, the score key and scale, cumulative
rewards, and no `info` (AgentGym's servers send none, so the client must judge success by the preset's rule).
AgentGym's real TextCraft server is tested directly (tests/test_agentgym_textcraft.py).
"""

from __future__ import annotations

import functools
import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import asdict
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from trajlake.collect.envs import SPLITS, Env, make_env
from trajlake.collect.envs.agentgym_presets import get_preset
from trajlake.collect.envs.agentgym_protocol import Preset
from trajlake.core.errors import TrajlakeError
from trajlake.schemas.records import Task

log = logging.getLogger(__name__)


class RequestError(Exception):
    """A request the server refuses; its message is the `{"error": ...}` reply."""


class _Instance:
    def __init__(self, env: Env):
        self.env, self.lock, self.observation, self.total = env, threading.Lock(), None, 0.0


class EnvApp:
    """The protocol without HTTP: live env instances by id (thread-safe) and one method per route."""

    def __init__(self, make: Callable[[], Env], split: str = "test", preset: str | Preset = "trajlake"):
        if split not in SPLITS:
            raise ValueError(f"unknown split {split!r}; valid splits: {', '.join(SPLITS)}")
        self.make, self.split, self.preset = make, split, get_preset(preset)
        self.template = make()  # lists tasks; never plays
        self.name = self.template.name
        self._lock = threading.Lock()
        self._instances: dict[int, _Instance] = {}
        self._next_id = 0

    @property
    def live(self) -> int:
        """How many instances are created and not yet closed."""
        with self._lock:
            return len(self._instances)

    def handle(self, method: str, route: str, body: dict, query: dict) -> Any:
        """Answer one request; RequestError (or the env's own error) for a refused one."""
        p = self.preset
        greeting = f"This is trajlake env {self.name}." if p.send_task else f"This is environment {p.title}."
        routes = {("GET", ""): lambda: greeting, ("POST", "create"): lambda: self.create(body),
                  ("POST", "reset"): lambda: self.reset(body), ("POST", "step"): lambda: self.step(body),
                  ("GET", "observation"): lambda: self.observation(query), ("POST", "close"): lambda: self.close(body),
                  ("GET", "list_envs"): self.ids, ("GET", "tasks"): lambda: self.tasks(query)}
        if p.word_list_route:
            routes[("GET", p.word_list_route)] = lambda: sorted(set(self.template.action_help.lower().split()))
        try:
            answer = routes[(method, route)]
        except KeyError:
            raise RequestError(f"unknown route {method} /{route}") from None
        return answer()

    def create(self, body: dict) -> Any:
        if self.preset.create_task_field:  # the tool envs create per task, and refuse a create without one
            _int(_field(body, self.preset.create_task_field), self.preset.create_task_field)
        env = self.make()
        with self._lock:
            env_id, self._next_id = self._next_id, self._next_id + 1
            self._instances[env_id] = _Instance(env)
        return env_id if self.preset.create_returns_bare_int else {self.preset.id_field: env_id}

    def reset(self, body: dict) -> dict:
        inst = self._get(body)
        if "task" in body:
            if not isinstance(body["task"], dict):
                raise RequestError("'task' must be an object with a Task's fields")
            try:
                task = Task(**body["task"])
            except TypeError as e:
                raise RequestError(f"invalid task: {e}") from None
        else:
            task = self.task_at(body.get("split", self.split), _int(_field(body, self.preset.reset_field),
                                                                      self.preset.reset_field))
        p = self.preset
        with inst.lock:
            inst.observation, inst.total = inst.env.reset(task), 0.0
            reply = {p.obs_key: inst.observation, "task_id": task.task_id}
        if p.reset_prefix_key:
            reply[p.reset_prefix_key] = f"Task {task.task_id}."
        if p.reset_suffix_key:
            reply[p.reset_suffix_key] = [a.strip() for a in inst.env.action_help.split(",")]
        return reply

    def step(self, body: dict) -> dict:
        inst, action = self._get(body), _field(body, "action")
        with inst.lock:  # two requests for one instance must not interleave inside the env
            obs, reward, done, info = inst.env.step(action)
            inst.observation = obs
            inst.total += reward
        p = self.preset
        if p.send_task:
            return {p.obs_key: obs, "reward": reward, "done": done, "info": info,
                    **({"score": info["score"]} if "score" in info else {})}
        reply = {p.obs_key: obs, "reward": inst.total if p.cumulative_reward else reward, "done": done}
        if p.score_key:
            reply[p.score_key] = info.get("score", 0.0) * p.score_scale
        return reply

    def observation(self, query: dict) -> dict:
        inst = self._get(query)
        if inst.observation is None:
            raise RequestError("no observation yet: reset the instance first")
        return {self.preset.obs_key: inst.observation}

    def close(self, body: dict) -> dict:
        env_id = _int(_field(body, self.preset.id_field), self.preset.id_field)
        with self._lock:
            inst = self._instances.pop(env_id, None)
        if inst is None:
            raise RequestError(f"the id {env_id} is not valid")
        inst.env.close()
        return {"closed": True}

    def ids(self) -> list[int]:
        with self._lock:
            return sorted(self._instances)

    def close_all(self) -> None:
        """Close every live instance (the server is stopping)."""
        with self._lock:
            instances, self._instances = list(self._instances.values()), {}
        for inst in instances:
            inst.env.close()

    def tasks(self, query: dict) -> dict:
        split = query.get("split", self.split)
        levels = self.template.difficulties
        n = _int(query.get("n", 100), "n")
        if not 0 <= n <= 10_000:
            raise RequestError(f"n must be in 0..10000, got {n}")
        if "difficulty" in query:
            d = _int(query["difficulty"], "difficulty")
            if d not in levels:
                raise RequestError(f"unknown difficulty {d}; valid: {list(levels)}")
            # task j of difficulty d sits at j*L + (d's rank) in the interleaved list that data_idx indexes
            indices = [j * len(levels) + levels.index(d) for j in range(n)]
        else:
            indices = list(range(n))
        return {"tasks": [asdict(self.task_at(split, k)) for k in indices]}

    @functools.lru_cache(maxsize=4096)  # noqa: B019 - one app per server, kept for the server's life
    def task_at(self, split: str, data_idx: int) -> Task:
        """Task `data_idx` of env.tasks(split) (difficulties interleaved), with meta["data_idx"] set."""
        if split not in SPLITS:
            raise RequestError(f"unknown split {split!r}; valid splits: {', '.join(SPLITS)}")
        if data_idx < 0:
            raise RequestError(f"data_idx must be >= 0, got {data_idx}")
        levels = self.template.difficulties
        level, index = levels[data_idx % len(levels)], data_idx // len(levels)
        task = self.template.tasks(split, n=index + 1, difficulty=level)[-1]
        return Task(**{**asdict(task), "meta": {**task.meta, "data_idx": data_idx}})

    def _get(self, fields: dict) -> _Instance:
        env_id = _int(_field(fields, self.preset.id_field), self.preset.id_field)
        with self._lock:
            inst = self._instances.get(env_id)
        if inst is None:
            raise RequestError(f"the id {env_id} is not valid")
        return inst


def _field(fields: dict, name: str) -> Any:
    if name not in fields:
        raise RequestError(f"missing field {name!r}")
    return fields[name]


def _int(value: Any, name: str) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        raise RequestError(f"{name!r} must be an integer, got {value!r}") from None


#: the largest request body read (an action or a task is text of a few hundred bytes; the client sends no more)
MAX_BODY_BYTES = 1 << 20


class _Handler(BaseHTTPRequestHandler):
    server: AgentGymServer

    def do_GET(self) -> None:
        self._serve("GET")

    def do_POST(self) -> None:
        self._serve("POST")

    def _serve(self, method: str) -> None:
        start = time.perf_counter()
        url = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        try:
            body = self._body() if method == "POST" else {}
            reply = self.server.app.handle(method, self.server.route(url.path), body, query)
        except Exception as e:  # anything an env raises becomes an error reply, never a dropped connection
            reply = {"error": str(e) or type(e).__name__}
        data = json.dumps(reply, default=str).encode()
        try:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):  # the client gave up (its timeout); nothing to tell it
            pass
        if self.server.log_requests:
            outcome = f"error: {reply['error']}" if isinstance(reply, dict) and "error" in reply else "ok"
            log.info("%s %s -> %s (%.1f ms)", method, url.path, outcome, 1000 * (time.perf_counter() - start))

    def _body(self) -> dict:
        length = self.headers.get("Content-Length") or "0"
        if not length.isdigit() or int(length) > MAX_BODY_BYTES:  # read(n) allocates n bytes before reading
            raise RequestError(f"Content-Length {length[:30]!r}: a request body is at most {MAX_BODY_BYTES} bytes")
        raw = self.rfile.read(int(length))
        if not raw.strip():
            return {}
        try:
            body = json.loads(raw)
        except ValueError as e:
            raise RequestError(f"invalid JSON body: {e}") from None
        if not isinstance(body, dict):
            raise RequestError("invalid JSON body: expected an object")
        return body

    def log_message(self, format: str, *args: Any) -> None:
        pass  # _serve logs one line per request instead of http.server's stderr lines


class AgentGymServer(ThreadingHTTPServer):
    """An `EnvApp` on HTTP; `start()` serves it from a background thread, `stop()` ends it and its instances."""

    daemon_threads = True  # a handler stuck in a slow env must not keep the process alive

    def __init__(self, app: EnvApp, host: str = "127.0.0.1", port: int = 0, prefix: str = "",
                 log_requests: bool = False):
        super().__init__((host, port), _Handler)
        self.app, self.prefix, self.log_requests = app, prefix.strip("/"), log_requests
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return self.server_address[1]

    @property
    def url(self) -> str:
        """The base URL, without the prefix."""
        return f"http://{self.server_address[0]}:{self.port}"

    def route(self, path: str) -> str:
        """The route of a request path: "/maze/step" -> "step" when the prefix is "maze" ("/step" too)."""
        path = path.strip("/")
        if self.prefix and (path == self.prefix or path.startswith(self.prefix + "/")):
            path = path[len(self.prefix):].strip("/")
        return path

    def start(self) -> AgentGymServer:
        """Serve from a daemon thread; returns self."""
        self._thread = threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True,
                                        name=f"agentgym-server-{self.port}")
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving, free the port and close every live env instance."""
        if self._thread is not None:
            self.shutdown()
            self._thread.join()
            self._thread = None
        self.server_close()
        self.app.close_all()

    def __enter__(self) -> AgentGymServer:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def make_server(env_name: str | Callable[[], Env], host: str = "127.0.0.1", port: int = 0, split: str = "test",
                prefix: str = "", preset: str | Preset = "trajlake", log_requests: bool = False,
                **env_kwargs: Any) -> AgentGymServer:
    """A server (not yet serving) for `env_name`: a registered env (made with `env_kwargs`) or an env factory.

    `port` 0 picks a free port (see `.port`). `prefix` defaults to the preset's (e.g. "maze").
    """
    make = env_name if callable(env_name) else functools.partial(make_env, env_name, **env_kwargs)
    preset = get_preset(preset)
    if not 0 <= port <= 65535:
        raise TrajlakeError(f"port must be 0..65535 (0: a free one), got {port}")
    try:
        return AgentGymServer(EnvApp(make, split, preset), host, port, prefix or preset.prefix, log_requests)
    except OSError as e:  # a host that does not resolve or is not this machine's, a port in use or not allowed
        raise TrajlakeError(f"cannot serve on host {host!r} port {port}: {e.strerror or e}") from None


def serve_env(env_name: str | Callable[[], Env], host: str = "127.0.0.1", port: int = 0, split: str = "test",
              prefix: str = "", **kwargs: Any) -> AgentGymServer:
    """Start serving `env_name` from a background thread (tests, notebooks); `stop()` the returned server.

    kwargs go to `make_server` (preset, log_requests, the env's constructor arguments).
    """
    return make_server(env_name, host, port, split, prefix, **kwargs).start()


def run_server(env: str, host: str = "127.0.0.1", port: int = 0, split: str = "test", prefix: str = "",
               preset: str | Preset = "trajlake") -> None:
    """Serve `env` until interrupted, logging one line per request (`trajlake serve-env`).

    Prints "serving ENV on URL" (with the real port) to stdout first, so a parent process can find the port.
    """
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    log.setLevel(logging.INFO)
    server = make_server(env, host, port, split, prefix, preset=preset, log_requests=True)
    where = f"{server.url}/{server.prefix}" if server.prefix else server.url
    print(f"serving {env} ({split}) on {where}", flush=True)
    try:
        server.serve_forever(poll_interval=0.2)
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
        server.app.close_all()
