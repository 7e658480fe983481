"""trajlake: an offline-first trajectory store and trainer for RL on LLM agents."""
__version__ = "0.1.0"
