"""Rewards as queries: reward specs compiled to SQL over the store, replay and diff. Token allocation is the
store's `token_rewards` view (schemas/views.py)."""

from pathlib import Path

from trajlake.rewards.spec import Allocation, Component, RewardSpec, SpecError, load_spec, parse_spec

SPECS_DIR = Path(__file__).parent / "specs"
DEFAULT_SPEC = SPECS_DIR / "default.toml"


def default_spec() -> RewardSpec:
    return load_spec(DEFAULT_SPEC)


__all__ = ["Allocation", "Component", "RewardSpec", "SpecError", "load_spec", "parse_spec", "default_spec",
           "DEFAULT_SPEC", "SPECS_DIR"]
