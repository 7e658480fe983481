-- Held-out numbers that are really held out: for each evaluation (a run of kind 'eval'), how many of its tasks
-- share a task id or a goal with an episode the evaluated policy's lineage trained on, and the success on the
-- clean tasks alone. The lineage is every episode in train_steps.episode_ids of the policy's own train run up to
-- its step and, through policies.parent_policy_id, of its ancestors' runs (view policy_training_episodes); an
-- episode's goal is read off its first observation where the env's own variable parts are known (view
-- episode_goals: TextCraft's `Goal: craft X`, whatever its shuffled crafting commands), else it is the whole
-- task the store holds (instruction and ground truth: doors' both rooms and keys), else the first observation.
-- Env errors are left out.
-- One row per evaluation; a clean held-out number has contaminated_tasks = 0. To see which trained-on episodes
-- share a goal with an evaluated task: SELECT * FROM episode_goals WHERE goal = '...'.
SELECT eval_run, policy_id, env, split, tasks, contaminated_tasks, episodes, success_rate,
       clean_tasks, clean_episodes, clean_success_rate
FROM eval_contamination
ORDER BY policy_id, eval_run
