-- Learning curve of every train run, one row per step from train_steps: the batch's success and reward,
-- held-out eval success where measured, KL, entropy and grad norm, and the policy the step saved.
-- (SFT steps have a loss instead: see the full metrics with SELECT metrics FROM train_steps.)
-- For one run add: WHERE s.run_id = 'RUN_ID'
SELECT s.run_id, s.step,
       (s.metrics->>'iteration')::INT AS iteration,
       round((s.metrics->>'success_mean')::DOUBLE, 3) AS success,
       round((s.metrics->>'reward_mean')::DOUBLE, 4) AS reward_mean,
       round((s.metrics->>'eval_success')::DOUBLE, 3) AS eval_success,
       round((s.metrics->>'kl')::DOUBLE, 5) AS kl,
       round((s.metrics->>'entropy')::DOUBLE, 4) AS entropy,
       round((s.metrics->>'grad_norm')::DOUBLE, 4) AS grad_norm,
       round((s.metrics->>'loss')::DOUBLE, 4) AS loss,
       s.policy_id, s.snapshot_read
FROM train_steps s
JOIN runs r USING (run_id)
WHERE r.kind = 'train'
ORDER BY r.started_at, s.run_id, s.step
