"""CollectConfig's checks at construction: each wrong value or type is one error naming its field."""

from __future__ import annotations

import pytest

from trajlake.collect.config import CollectConfig
from trajlake.core.errors import TrajlakeError


@pytest.mark.parametrize("field, value", [
    ("tasks", 0), ("samples", 0), ("max_turns", 0), ("concurrency", 0), ("workers", -1),
    ("template", "xml"), ("on_format_error", "crash"), ("truncation", "drop"), ("chunk_turns", 0),
    ("chunk_seconds", 0), ("temperature", -0.5), ("top_p", 0.0), ("top_p", 1.5), ("max_new_tokens", 0),
    ("max_context_tokens", 48),
])
def test_config_rejects_bad_values(field, value):
    with pytest.raises(TrajlakeError, match=rf"collect config: .*{field}"):
        CollectConfig(env="doors", policy="hf:x", **{field: value})


def test_config_needs_a_tokenizer_for_text_policies_and_a_url_for_agentgym():
    with pytest.raises(TrajlakeError, match="tokenizer"):
        CollectConfig(env="doors", policy="scripted:doors")
    with pytest.raises(TrajlakeError, match="tokenizer"):
        CollectConfig(env="doors", policy="openai:http://x#m")
    with pytest.raises(TrajlakeError, match=r"env agentgym/textcraft plays an AgentGym server: give its URL"):
        CollectConfig(env="agentgym/textcraft", policy="hf:x")
    with pytest.raises(TrajlakeError, match="unknown env 'agentgym'"):
        CollectConfig(env="agentgym", policy="hf:x", env_url="http://127.0.0.1:9")


@pytest.mark.parametrize("field, value, message", [
    ("tasks", "3", "tasks must be an integer, got '3' (str)"),
    ("tasks", True, "tasks must be an integer, got True (bool)"),
    ("temperature", "hot", "temperature must be a number, got 'hot' (str)"),
    ("difficulty", "1", "difficulty must be an integer (or left unset), got '1' (str)"),
    ("env_kwargs", ["url"], "env_kwargs must be a table (mapping), got ['url'] (list)"),
    ("env_kwargs", {"url": "http://x"}, "the env server's URL is env_url, not env_kwargs['url']"),
    ("progress", "yes", "progress must be true or false, got 'yes' (str)"),
])
def test_config_checks_field_types(field, value, message):
    with pytest.raises(TrajlakeError) as e:
        CollectConfig(env="doors", policy="hf:x", **{field: value})
    assert str(e.value) == f"collect config: {message}"


def test_rollout_settings_are_declared_once():
    """Collect, train and evaluate take the same rollout fields, with one set of defaults (evaluate plays the
    test split), and the CLI's options show each field's own help."""
    import dataclasses

    from trajlake.collect.config import ROLLOUT_FIELDS, RolloutConfig
    from trajlake.core.config_types import field_docs
    from trajlake.evaluate.config import EvalConfig
    from trajlake.train.config_sections import RolloutSection

    defaults = {f.name: f.default for f in dataclasses.fields(RolloutConfig)}
    for cls in (CollectConfig, RolloutSection, EvalConfig):  # RolloutSection: TrainConfig's [rollout]
        own = {f.name: f.default for f in dataclasses.fields(cls) if f.name in ROLLOUT_FIELDS}
        assert own == {**defaults, **({"split": "test"} if cls is EvalConfig else {})}, cls
    docs = field_docs(CollectConfig)
    assert set(ROLLOUT_FIELDS) <= set(docs) and docs["max_turns"].startswith("Turn cap per episode")


@pytest.mark.parametrize("command", ["collect", "evaluate"])
def test_cli_rollout_options_come_from_the_config(command):
    from typer.testing import CliRunner

    from trajlake.cli import app

    out = CliRunner().invoke(app, [command, "--help"], env={"COLUMNS": "200"}).output
    for option in ("--max-turns", "--max-context-tokens", "--on-format-error", "--concurrency", "--env-url"):
        assert option in out, option
    assert "Turn cap per episode" in out


def test_an_integer_is_a_float_field_as_toml_reads_it():
    assert CollectConfig(env="doors", policy="hf:x", temperature=1).temperature == 1.0
