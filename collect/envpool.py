"""Where env instances live while episodes run: in-process, on threads (HTTP envs), or on Ray actors.

Each live episode owns a slot; `step_many` steps every live episode's env once, concurrently where the pool
allows, and returns, per slot, either the env's answer or the error it raised (an env error ends only its
own episode, never the run).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from trajlake.core.errors import TrajlakeError


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

    def nodes(self) -> list[str]:
        """The Ray node id of each env worker (none: the envs live in this process)."""
        return []


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
    """Envs on `workers` Ray actors, dealt round the cluster's nodes and stepped concurrently.

    An episode stays on the actor that reset its env (the env's state lives there); a new one goes to the live
    actor holding the fewest. A lost actor (a killed worker, a lost node) ends only the episodes it held, each
    with an env error that a re-run of the same command retries; with every actor lost the run fails, keeping
    what it finished."""

    def __init__(self, factory: Callable[[], Any], workers: int):
        from trajlake.collect.ray_init import ensure_ray

        self.ray = ray = ensure_ray(workers)
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        # Dealt round the cluster's live nodes by hand: an actor asking for no resources lands on the driver's
        # own node under SPREAD and under a soft node affinity alike (both left every env worker on one node of
        # a three-node cluster), and asking for any CPU share would wait behind replicas holding every CPU.
        nodes = sorted(n["NodeID"] for n in ray.nodes() if n["Alive"])
        actor = ray.remote(num_cpus=0)(_EnvHost)
        self.actors = [actor.options(scheduling_strategy=NodeAffinitySchedulingStrategy(nodes[i % len(nodes)],
                                                                                       soft=False)).remote(factory)
                       for i in range(workers)]
        self.alive = list(range(workers))
        self.home: dict[int, int] = {}  # slot -> the actor holding its env
        self.lost: dict[int, str] = {}  # a lost actor -> what Ray said of it

    def nodes(self) -> list[str]:
        """The Ray node id of each live actor."""
        return self.ray.get([self.actors[i].node.remote() for i in self.alive])

    def _place(self, slot: int) -> int:
        if not self.alive:
            raise TrajlakeError(f"every env worker ({len(self.actors)}) died; re-run the same command to resume "
                                "the run")
        held = Counter(self.home.values())
        self.home[slot] = min(self.alive, key=lambda i: (held[i], i))
        return self.home[slot]

    def _answers(self, calls: list[tuple[int, Any]]) -> list[Any]:
        """Each (actor, call) pair's answer, or an env error where its actor is lost."""
        out = []
        for i, ref in calls:
            if i in self.alive:
                try:
                    out.append(self.ray.get(ref))
                    continue
                except self.ray.exceptions.RayActorError as e:
                    self.alive.remove(i)
                    self.lost[i] = type(e).__name__
            out.append(Outcome(done=True, error=f"env worker {i} lost ({self.lost[i]}): its episodes end here and "
                                                "a re-run retries them"))
        return out

    def reset(self, items):
        calls = []
        for s, t in items:
            i = self._place(s)
            calls.append((i, self.actors[i].reset.remote(s, t)))
        return self._answers(calls)

    def step_many(self, items):
        calls = []
        for s, a in items:
            i = self.home[s]
            calls.append((i, self.actors[i].step.remote(s, a) if i in self.alive else None))
        return self._answers(calls)

    def release(self, slot: int) -> None:
        i = self.home.pop(slot, None)
        if i in self.alive:
            self.actors[i].release.remote(slot)

    def close(self) -> None:
        for i in self.alive:
            self.ray.kill(self.actors[i])
        self.alive = []


class _EnvHost(LocalEnvPool):
    """A Ray actor hosting the envs of its slots (methods take one slot at a time)."""

    def reset(self, slot, task):  # type: ignore[override]
        return self._reset(slot, task)

    def step(self, slot, action):
        return self._step(slot, action)

    def node(self) -> str:
        import ray

        return ray.get_runtime_context().get_node_id()
