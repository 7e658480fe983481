"""Where an RL iteration's episodes come from, behind one interface: `FreshRollouts` plays the current policy
into the store (a collect run `<run_id>/it-<n>`), scores it and mixes in replayed earlier rollouts;
`StoredRollouts` deals the groups of episodes a `train_filter` selected (train/stored_rollouts.py). Both answer
`episodes(it)` with the iteration's episodes read at one snapshot and the filter that selects them (the step's
lineage). Only rank 0 calls them; the loop broadcasts what they return.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from trajlake.core.sql_text import sql_str
from trajlake.rewards.score import score
from trajlake.train.algos.groups import outcome_groups
from trajlake.train.batch import EpisodeSeq, load_episodes
from trajlake.train.engine import Engines
from trajlake.train.rollouts import collect_run, rollout_config
from trajlake.train.stored_rollouts import StoredData, replay_filter
from trajlake.train.train_run import TrainRun


@dataclass(frozen=True)
class IterationEpisodes:
    """One iteration's episodes: `seqs` (in episode_id order, as one load of `where` gives them, so a replay of
    the step reads the same batch) read at `snapshot`, `where` selecting exactly them, how many of them were
    replayed from earlier iterations (all of them when they come from the store), and how many rounds of
    rollouts dynamic sampling played (1 without it)."""

    snapshot: int
    where: str
    seqs: list[EpisodeSeq]
    replayed: int
    rounds: int = 1


class FreshRollouts:
    """Rollouts of the current policy, collected, scored with the run's spec and read back at once; with
    min_outcome_groups, further rounds on other tasks until enough groups' outcomes differ (DAPO's dynamic
    sampling), at most sampling_rounds."""

    def __init__(self, run: TrainRun, engines: Engines, spec) -> None:
        self.run, self.engines, self.spec = run, engines, spec

    def episodes(self, it: int) -> IterationEpisodes:
        r, spec = self.run, self.spec
        where, rounds = self._rounds(it)
        snap = r.lake.current_snapshot()
        seqs = load_episodes(r.lake, where, snapshot=snap, spec_id=spec.spec_id)
        replay = replay_filter(r.cfg, r.run_id, it, r.lake, snap)  # earlier rollouts mixed in, if asked
        if not replay:
            return IterationEpisodes(snap, where, seqs, 0, rounds)
        replayed = load_episodes(r.lake, replay, snapshot=snap, spec_id=spec.spec_id)
        return IterationEpisodes(snap, f"({where}\n) OR ({replay}\n)",
                                 sorted(seqs + replayed, key=lambda s: s.episode_id), len(replayed), rounds)

    def _rounds(self, it: int) -> tuple[str, int]:
        """Play and score the iteration's rounds: (the filter selecting their episodes, the rounds played). A
        restarted iteration resumes each stored round, whose outcomes decide again as they did."""
        r, c = self.run, self.run.cfg
        run_ids: list[str] = []
        played: frozenset[int] = frozenset()
        for k in range(c.sampling_rounds):
            cc = rollout_config(r, r.policy_id, it, k, played)
            run_ids.append(collect_run(r, self.engines, r.policy_id, r.model_path, cc))
            score(r.lake, self.spec, where=f"run_id = {sql_str(run_ids[-1])}", run_id=r.run_id)
            played |= set(cc.task_positions or ())
            if not c.min_outcome_groups or k + 1 == c.sampling_rounds:
                break
            seqs = load_episodes(r.lake, _runs_filter(run_ids), snapshot=r.lake.current_snapshot())
            if outcome_group_count(seqs) >= c.min_outcome_groups:
                break
        return _runs_filter(run_ids), len(run_ids)


def _runs_filter(run_ids: list[str]) -> str:
    if len(run_ids) == 1:
        return f"run_id = {sql_str(run_ids[0])}"
    return f"run_id IN ({', '.join(sql_str(x) for x in run_ids)})"


def outcome_group_count(seqs: list[EpisodeSeq]) -> int:
    """How many groups of `seqs` hold both a success and a failure (the update's own count)."""
    if not seqs:
        return 0
    success = torch.tensor([s.success for s in seqs])
    return outcome_groups(success, [s.group_id for s in seqs])[1]


class StoredRollouts:
    """This iteration's groups of the stored episodes the run trains on, at their pinned snapshot."""

    def __init__(self, run: TrainRun, data: StoredData, spec) -> None:
        self.run, self.data, self.spec = run, data, spec

    def episodes(self, it: int) -> IterationEpisodes:
        where = self.data.iteration_filter(it, self.run.cfg.tasks)
        seqs = load_episodes(self.run.lake, where, snapshot=self.data.snapshot, spec_id=self.spec.spec_id)
        return IterationEpisodes(self.data.snapshot, where, seqs, len(seqs))


__all__ = ["IterationEpisodes", "FreshRollouts", "StoredRollouts", "outcome_group_count"]
