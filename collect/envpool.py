"""Where env instances live while episodes run: in-process, on threads (HTTP envs), or on Ray actors.

Each live episode owns a slot; `step_many` steps every live episode's env once, concurrently where the pool
allows, and returns, per slot, either the env's answer or the error it raised (an env error ends only its
own episode, never the run).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any


@dataclass
class Outcome:
    """An env's answer to one action, or the error it raised."""

    observation: str = ""
    reward: float = 0.0
    done: bool = False
    info: dict | None = None
    error: str | None = None


def _call(fn: Callable, *args) -> Any:
    try:
        return fn(*args)
    except Exception as e:  # an env failing (a dead server, a bug) ends its episode with the reason
        return Outcome(done=True, error=f"{type(e).__name__}: {e}")


class EnvPool(ABC):
    @abstractmethod
    def reset(self, items: list[tuple[int, Any]]) -> list[str | Outcome]:
        """Reset the env of each (slot, task); an Outcome with `error` where that failed."""

    @abstractmethod
    def step_many(self, items: list[tuple[int, str]]) -> list[Outcome]:
        """Step the env of each (slot, action) once."""

    @abstractmethod
    def release(self, slot: int) -> None:
        """The slot's episode ended: close what its env holds (a remote instance)."""

    def close(self) -> None:
        pass


class LocalEnvPool(EnvPool):
    """Env instances in this process; stepped one after another, or on threads when `threads` > 0."""

    def __init__(self, factory: Callable[[], Any], threads: int = 0):
        self.factory = factory
        self.envs: dict[int, Any] = {}
        self.pool = ThreadPoolExecutor(threads) if threads > 0 else None

    def _map(self, fn, items):
        if self.pool is None or len(items) < 2:
            return [fn(*it) for it in items]
        return list(self.pool.map(lambda it: fn(*it), items))

    def _reset(self, slot: int, task: Any) -> str | Outcome:
        env = self.envs.get(slot)
        if env is None:
            env = self.envs[slot] = self.factory()
        return _call(env.reset, task)

    def _step(self, slot: int, action: str) -> Outcome:
        out = _call(self.envs[slot].step, action)
        return out if isinstance(out, Outcome) else Outcome(out[0], float(out[1]), bool(out[2]), dict(out[3]))

    def reset(self, items):
        return self._map(self._reset, items)

    def step_many(self, items):
        return self._map(self._step, items)

    def release(self, slot: int) -> None:
        env = self.envs.pop(slot, None)
        if env is not None:
            _call(env.close)

    def close(self) -> None:
        for slot in list(self.envs):
            self.release(slot)
        if self.pool is not None:
            self.pool.shutdown()


class RayEnvPool(EnvPool):
    """Envs on `workers` Ray actors (slot i on actor i % workers), stepped concurrently."""

    def __init__(self, factory: Callable[[], Any], workers: int):
        from trajlake.collect.ray_init import ensure_ray

        self.ray = ray = ensure_ray(workers)
        actor = ray.remote(num_cpus=0)(_EnvHost)
        self.actors = [actor.remote(factory) for _ in range(workers)]

    def _actor(self, slot: int):
        return self.actors[slot % len(self.actors)]

    def reset(self, items):
        return self.ray.get([self._actor(s).reset.remote(s, t) for s, t in items])

    def step_many(self, items):
        return self.ray.get([self._actor(s).step.remote(s, a) for s, a in items])

    def release(self, slot: int) -> None:
        self._actor(slot).release.remote(slot)

    def close(self) -> None:
        for a in self.actors:
            self.ray.kill(a)


class _EnvHost(LocalEnvPool):
    """A Ray actor hosting the envs of its slots (methods take one slot at a time)."""

    def reset(self, slot, task):  # type: ignore[override]
        return self._reset(slot, task)

    def step(self, slot, action):
        return self._step(slot, action)
