"""Rewards as queries: reward specs compiled to SQL over the store, token allocation as a view, replay."""

from pathlib import Path

from trajlake.rewards.allocate import REWARD_SPANS_SQL, TOKEN_REWARDS_SQL
from trajlake.rewards.spec import Allocation, Component, RewardSpec, SpecError, load_spec, parse_spec
from trajlake.store.lake import register_view

register_view("token_rewards", TOKEN_REWARDS_SQL)
register_view("reward_spans", REWARD_SPANS_SQL)

SPECS_DIR = Path(__file__).parent / "specs"
DEFAULT_SPEC = SPECS_DIR / "default.toml"


def default_spec() -> RewardSpec:
    return load_spec(DEFAULT_SPEC)


__all__ = ["Allocation", "Component", "RewardSpec", "SpecError", "load_spec", "parse_spec", "default_spec",
           "DEFAULT_SPEC", "SPECS_DIR"]
