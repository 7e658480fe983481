"""Where an RL iteration's episodes come from, behind one interface: `FreshRollouts` plays the current policy
into the store (a collect run `<run_id>/it-<n>`), scores it and mixes in replayed earlier rollouts;
`StoredRollouts` deals the groups of episodes a `train_filter` selected (train/stored_rollouts.py). Both answer
`episodes(it)` with the iteration's episodes read at one snapshot and the filter that selects them (the step's
lineage). Only rank 0 calls them; the loop broadcasts what they return.
"""

from __future__ import annotations

from dataclasses import dataclass

from trajlake.core.sql_text import sql_str
from trajlake.rewards.score import score
from trajlake.train.batch import EpisodeSeq, load_episodes
from trajlake.train.engine import Engines
from trajlake.train.rollouts import collect_run, rollout_config
from trajlake.train.stored_rollouts import StoredData, replay_filter
from trajlake.train.train_run import TrainRun


@dataclass(frozen=True)
class IterationEpisodes:
    """One iteration's episodes: `seqs` (in episode_id order, as one load of `where` gives them, so a replay of
    the step reads the same batch) read at `snapshot`, `where` selecting exactly them, and how many of them were
    replayed from earlier iterations (all of them when they come from the store)."""

    snapshot: int
    where: str
    seqs: list[EpisodeSeq]
    replayed: int


class FreshRollouts:
    """Rollouts of the current policy, collected, scored with the run's spec and read back at once."""

    def __init__(self, run: TrainRun, engines: Engines, spec) -> None:
        self.run, self.engines, self.spec = run, engines, spec

    def episodes(self, it: int) -> IterationEpisodes:
        r, spec = self.run, self.spec
        crun = collect_run(r, self.engines, r.policy_id, r.model_path, rollout_config(r, r.policy_id, it))
        where = f"run_id = {sql_str(crun)}"
        score(r.lake, spec, where=where, run_id=r.run_id)
        snap = r.lake.current_snapshot()
        seqs = load_episodes(r.lake, where, snapshot=snap, spec_id=spec.spec_id)
        replay = replay_filter(r.cfg, r.run_id, it, r.lake, snap)  # earlier rollouts mixed in, if asked
        if not replay:
            return IterationEpisodes(snap, where, seqs, 0)
        replayed = load_episodes(r.lake, replay, snapshot=snap, spec_id=spec.spec_id)
        return IterationEpisodes(snap, f"({where}\n) OR ({replay}\n)",
                                 sorted(seqs + replayed, key=lambda s: s.episode_id), len(replayed))


class StoredRollouts:
    """This iteration's groups of the stored episodes the run trains on, at their pinned snapshot."""

    def __init__(self, run: TrainRun, data: StoredData, spec) -> None:
        self.run, self.data, self.spec = run, data, spec

    def episodes(self, it: int) -> IterationEpisodes:
        where = self.data.iteration_filter(it, self.run.cfg.tasks)
        seqs = load_episodes(self.run.lake, where, snapshot=self.data.snapshot, spec_id=self.spec.spec_id)
        return IterationEpisodes(self.data.snapshot, where, seqs, len(seqs))


__all__ = ["IterationEpisodes", "FreshRollouts", "StoredRollouts"]
