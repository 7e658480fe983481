"""Policy schemes are one registry: a new scheme is one registration, a taken name is refused, an unknown one
is refused listing the registered ones."""

from __future__ import annotations

import pytest

from trajlake.collect.policies import POLICY_SCHEMES, PolicyScheme, check_policy_spec, load_policy
from trajlake.collect.policies.scripted import ScriptedPolicy
from trajlake.collect.templates import get_template
from trajlake.core.errors import TrajlakeError


@pytest.fixture
def schemes(monkeypatch):
    monkeypatch.setattr(POLICY_SCHEMES, "_entries", dict(POLICY_SCHEMES._entries))  # gone again after the test
    return POLICY_SCHEMES


def test_a_new_scheme_is_one_registration(schemes):
    """`always:ENV` plays the env's expert without noise: a scheme built from an existing policy class."""
    def check(spec, arg, env, lake):
        if arg != env:
            raise TrajlakeError(f"{spec} plays {arg}, not {env}")

    schemes.add("always", PolicyScheme(name="always", check=check, text=True,
                                       load=lambda spec, arg, *, env, template, tokenizer, **_: ScriptedPolicy(
                                           env, template, tokenizer)))
    template = get_template("action")
    policy = load_policy("always:doors", env="doors", template=template)
    assert isinstance(policy, ScriptedPolicy)
    with pytest.raises(TrajlakeError, match="always:maze plays maze, not doors"):
        check_policy_spec("always:maze", env="doors")
    with pytest.raises(TrajlakeError, match=r"use one of hf:\.\.\., vllm:\.\.\., openai:\.\.\., scripted:\.\.\., "
                                            r"policy:\.\.\., always:\.\.\."):
        check_policy_spec("nope:x", env="doors")


def test_a_taken_scheme_is_refused(schemes):
    with pytest.raises(ValueError, match="policy scheme 'hf' is already registered"):
        schemes.add("hf", schemes["hf"])
