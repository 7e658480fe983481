"""Policy replicas on Ray: N copies of a model policy as Ray actors, behind the one Policy the rollout drives.

The rollout loop, its envs and its writes stay in this process (one writer to the store); only generation is
spread. Each live episode stays on one replica for its whole life (its KV cache lives there): a new episode
goes to the replica with the fewest live ones. A turn's requests go to their replicas at once and are
answered in parallel. A request carries the episode's whole context as token ids, so when a replica dies
mid-run (a killed actor, a lost node), its requests are sent again to the replicas left and its episodes
continue there: nothing is lost, and nothing is written twice (the rollout writes an episode only when it
ends). With every replica gone the run fails, keeping what it finished; re-running it resumes.

On one machine the replicas share its cores (each actor gets `cpus` of them and as many torch threads).
With `RAY_ADDRESS` set (`ray start --head` on one machine, `ray start --address HEAD:6379` on the others)
they are spread over the cluster's nodes; the model folder must be readable at the same path on each.
"""

from __future__ import annotations

import os
from typing import Any

from trajlake.collect.policies.base import Generation, Policy, Request, SamplingParams
from trajlake.collect.ray_init import ensure_ray
from trajlake.core.errors import TrajlakeError


def replicable() -> list[str]:
    """The policy schemes a replica can load: those that play a checkpoint folder (`from_checkpoint`)."""
    from trajlake.collect.policies import POLICY_SCHEMES

    return [name for name, scheme in POLICY_SCHEMES.items() if scheme.from_checkpoint is not None]


class _Replica:
    """A Ray actor holding one policy (methods mirror Policy's)."""

    def __init__(self, spec: str, policy_id: str, threads: int):
        import torch

        torch.set_num_threads(max(1, threads))
        from trajlake.collect.policies import POLICY_SCHEMES

        scheme, _, path = spec.partition(":")
        self.policy = POLICY_SCHEMES[scheme].from_checkpoint(path, policy_id)

    def generate(self, requests: list[Request], params: SamplingParams) -> list[Generation]:
        return self.policy.generate(requests, params)

    def reset_rng(self, seed: int) -> None:
        self.policy.reset_rng(seed)

    def end_episode(self, key: str) -> None:
        self.policy.end_episode(key)

    def reload(self, path: str) -> None:
        """New weights from a checkpoint folder (the train loop, after an update), in the running actor: vLLM
        loads them into its engine; a transformers policy is rebuilt on them (its caches hold the old ones)."""
        from trajlake.collect.policies.hf import HFPolicy

        if isinstance(self.policy, HFPolicy):
            policy_id = self.policy.policy_id
            self.policy.close()
            self.policy = HFPolicy(path, policy_id=policy_id)
        else:
            self.policy.reload(path)

    def pid(self) -> int:
        return os.getpid()

    def node(self) -> str:
        import ray

        return ray.get_runtime_context().get_node_id()


class ReplicatedPolicy(Policy):
    """`replicas` copies of the model policy `spec` (`hf:PATH` or `vllm:PATH`) on Ray actors."""

    exact_tokens = True

    def __init__(self, spec: str, replicas: int, *, policy_id: str | None = None, cpus: int = 1):
        scheme, _, path = spec.partition(":")
        if scheme not in replicable():
            raise TrajlakeError(f"policy {spec}: replicas copy a model policy ({', '.join(replicable())}, policy:ID "
                                "or run:ID); a text policy (scripted, openai) runs once: use concurrency")
        if replicas < 1:
            raise TrajlakeError(f"replicas must be >= 1, got {replicas}")
        from pathlib import Path

        from trajlake.lm.load import load_tokenizer

        self.model_path = str(Path(path).absolute())
        self.policy_id = policy_id or f"{scheme}:{self.model_path}"
        self.tokenizer = load_tokenizer(self.model_path)  # the rollout renders chats here
        self.ray = ensure_ray(max(os.cpu_count() or 1, replicas * cpus))
        actor = self.ray.remote(num_cpus=cpus, scheduling_strategy="SPREAD")(_Replica)
        spec = f"{scheme}:{self.model_path}"
        self.actors: list[Any] = [actor.remote(spec, self.policy_id, cpus) for _ in range(replicas)]
        self.alive = list(range(replicas))
        self.home: dict[str, int] = {}  # episode key -> its replica
        self.ray.get([a.pid.remote() for a in self.actors])  # fail here, not mid-run, if a replica cannot load
        self.retried = 0  # requests sent again after their replica died

    def nodes(self) -> list[str]:
        return self.ray.get([self.actors[i].node.remote() for i in self.alive])

    def _load(self, i: int) -> int:
        return sum(1 for r in self.home.values() if r == i)

    def _place(self, key: str) -> int:
        if self.home.get(key) not in self.alive:
            self.home[key] = min(self.alive, key=lambda i: (self._load(i), i))
        return self.home[key]

    def start_episode(self, key: str, task: Any) -> None:
        self._place(key)

    def end_episode(self, key: str) -> None:
        i = self.home.pop(key, None)
        if i in self.alive:
            self.actors[i].end_episode.remote(key)  # frees its cache there; no need to wait

    def reset_rng(self, seed: int) -> None:
        self._call_all("reset_rng", lambda i: (seed + i,))

    def reload(self, path: str) -> None:
        self._call_all("reload", lambda i: (str(path),))

    def _call_all(self, method: str, args) -> None:
        refs = {i: getattr(self.actors[i], method).remote(*args(i)) for i in self.alive}
        for i, ref in refs.items():
            try:
                self.ray.get(ref)
            except self.ray.exceptions.RayActorError:
                self._lost(i)

    def _lost(self, i: int) -> None:
        if i in self.alive:
            self.alive.remove(i)
        if not self.alive:
            raise TrajlakeError(f"every policy replica of {self.policy_id} died (the last: replica {i}); "
                                "re-run the same command to resume the run")

    def generate(self, requests: list[Request], params: SamplingParams) -> list[Generation]:
        out: list[Generation | None] = [None] * len(requests)
        todo = list(range(len(requests)))
        while todo:
            groups: dict[int, list[int]] = {}
            for k in todo:
                groups.setdefault(self._place(requests[k].key), []).append(k)
            refs = {i: self.actors[i].generate.remote([requests[k] for k in ks], params) for i, ks in groups.items()}
            todo = []
            for i, ref in refs.items():
                try:
                    for k, g in zip(groups[i], self.ray.get(ref), strict=True):
                        out[k] = g
                except self.ray.exceptions.RayActorError:
                    self._lost(i)  # its episodes move to the replicas left, which answer these requests again
                    todo += groups[i]
                    self.retried += len(groups[i])
        return out  # type: ignore[return-value]

    def close(self) -> None:
        for i in self.alive:
            self.ray.kill(self.actors[i])
        self.alive = []


__all__ = ["ReplicatedPolicy", "replicable"]
