"""Training from the store: SFT, GRPO and PPO with DeepSpeed engines.

Reading order, one RL iteration from the top:

- loop.py: `train` (RL iterations) and `sft` (steps on a store query); `run` is the entry point.
- train_run.py: the run's row in the run ledger (store/runs.py), its resume point, engines and checkpoints.
- sources/: where an iteration's episodes come from, one interface: fresh.py plays the policy into collect
  runs (and replays earlier rollouts), stored.py deals a `train_filter`'s groups, evaluation.py is the held-out
  evaluation during training.
- batch.py: the episodes read back token for token, with their per-token rewards, as a padded batch.
- steps.py: one update over a batch (`prepare`, `rl_update`, `sft_update`); microbatch.py deals it to
  processes and micro-batches; forward.py computes log-probs and values (packing.py: a micro-batch's rows
  as one unpadded row); engine.py builds the DeepSpeed engines; distributed.py is the collective glue.
- algos/: the math as pure functions in registries: advantage estimators, losses, KL, algos (algorithms.py).
- config.py with config_checks.py: TrainConfig; overrides.py: the fields the command line overrides.
- checkpoint.py: checkpoints and their policies rows; reproduce.py: `train --replay`, a stored step again.
- progress.py, trackers.py, finite.py, turn_structure.py: progress output, experiment trackers, the check for
  non-finite updates, turn boundaries of stored episodes.
"""
