"""Where an RL iteration's episodes come from, behind one interface: each source answers `episodes(it)` with
an `IterationEpisodes`, the iteration's episodes read at one snapshot and the filter that selects them (the
step's lineage). Only rank 0 calls them; the loop broadcasts what they return.

- fresh.py: `FreshRollouts` plays the current policy into the store (collect runs `<run_id>/it-<n>`, with
  dynamic sampling's further rounds), scores them and mixes in replayed earlier rollouts; it also holds how an
  iteration's collect run is configured (the task rotation or selector, the seeds).
- stored.py: `StoredRollouts` deals the groups of stored episodes a `train_filter` selected.
- asynchronous.py: `AsyncRollouts` hands out the groups that collector processes, playing the newest stored
  policy beside the learner, stored (`async_collectors`).
- evaluation.py: the held-out evaluation during training (greedy, on `eval_split`), played the same way.

Each source's `close()` ends what it started (the async collectors) when the run ends.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from trajlake.train.batch import EpisodeSeq


@dataclass(frozen=True)
class IterationEpisodes:
    """One iteration's episodes: `seqs` (in episode_id order, as one load of `where` gives them, so a replay of
    the step reads the same batch) read at `snapshot`, `where` selecting exactly them, how many of them were
    replayed from earlier iterations (all of them when they come from the store), how many rounds of rollouts
    dynamic sampling played (1 without it), and what else the source measured, as train_steps metrics."""

    snapshot: int
    where: str
    seqs: list[EpisodeSeq]
    replayed: int
    rounds: int = 1
    metrics: dict[str, float] = field(default_factory=dict)


__all__ = ["IterationEpisodes"]
