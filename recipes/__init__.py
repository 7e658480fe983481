"""Runnable recipes built on the stages: `python -m trajlake.recipes.demo` (make demo), `.rescore` (make
rescore) and `.agentgym_pipeline` (make agentgym-pipeline). bench/learning.py runs the demo's recipe per seed."""
