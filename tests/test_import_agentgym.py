"""Exact per-turn tokens (collect.chat) and the AgentGym importer (collect.importers.agentgym)."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from transformers import AutoTokenizer

from tests.conftest import SHARED
from trajlake.collect.chat import ChatRenderer, ChatTemplateError, full_sequence
from trajlake.core.errors import TrajlakeError
from trajlake.interop.importers import TrajectoryImportError, import_agentgym, read_records
from trajlake.interop.importers.agentgym_rows import ROLES, parse_action
from trajlake.lm.build import CHAT_TEMPLATE, build_tiny_model
from trajlake.schemas.records import Turn
from trajlake.store import Lake

AGENTGYM = SHARED / "data" / "agentgym"
EOT = "<|im_end|>"
CONV = [
    {"role": "system", "content": "You play a maze game."},
    {"role": "user", "content": "You are at (1, 2). Walls to the north."},
    {"role": "assistant", "content": "OK."},
    {"role": "user", "content": "Go."},
    {"role": "assistant", "content": "Thought: east.\nAction: move east\n"},
    {"role": "user", "content": "You are at (2, 2)."},
    {"role": "assistant", "content": "<think>south</think><action>move south</action>"},
]
AGENT = [False, False, False, False, True, False, True]


@pytest.fixture(scope="session")
def tok_path(tmp_path_factory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


@pytest.fixture(scope="session")
def tok(tok_path):
    return AutoTokenizer.from_pretrained(tok_path)


def _tok_with(tok_path, template: str):
    t = AutoTokenizer.from_pretrained(tok_path)
    t.chat_template = template
    return t


# ---- collect.chat ---------------------------------------------------------------------------
def test_segments_are_exact_prefix_differences(tok):
    r = ChatRenderer(tok)
    segs = r.segments(CONV, AGENT)
    ids, mask = full_sequence(segs)
    full = r.render(CONV)
    text = tok.decode(ids)
    assert full.startswith(text) and full[len(text):] == "\n"  # only the template's trailing newline is left
    for (p, resp), agent_msg in zip(segs, [CONV[4], CONV[6]], strict=True):
        assert tok.decode(p).endswith("<|im_start|>assistant\n")
        assert tok.decode(resp) == agent_msg["content"] + EOT
        assert resp[-1] == tok.convert_tokens_to_ids(EOT)  # special tokens in the text map to their ids
    assert tok.decode(segs[1][0]).startswith("\n<|im_start|>user")  # "\n" after <|im_end|>: next prompt
    assert "OK." in tok.decode(segs[0][0])  # a context reply is prompt, not agent tokens
    assert sum(mask) == sum(len(resp) for _, resp in segs)
    assert [i for i, m in zip(ids, mask, strict=True) if m] == [t for _, resp in segs for t in resp]


def test_incremental_api_equals_whole_conversation(tok):
    r = ChatRenderer(tok)
    whole = r.segments(CONV, AGENT)
    conv = r.conversation(CONV[:4])
    assert conv.prompt() == whole[0][0]
    assert conv.reply_ids(whole[0][1]) == CONV[4]["content"]  # as a rollout stores sampled ids
    assert conv.observe(CONV[5]["content"]) == whole[1][0]
    assert conv.reply(CONV[6]["content"]) == whole[1][1]  # teacher forcing gives the same ids
    assert conv.text == r.render(CONV)[:-1]
    assert len(r.segments(CONV)) == 3  # default mask: every assistant message, "OK." included


def test_cut_off_reply_leaves_closing_to_next_prompt(tok):
    r = ChatRenderer(tok)
    conv = r.conversation(CONV[:2])
    conv.prompt()
    conv.reply_ids(tok.encode("move we", add_special_tokens=False))  # max_new_tokens hit: no <|im_end|>
    assert tok.decode(conv.observe("blocked")).startswith(EOT + "\n<|im_start|>user\nblocked")


def test_template_that_rewrites_replies_and_one_without_end_token(tok_path):
    trim = CHAT_TEMPLATE.replace("message['content']", "(message['content'] | trim)")
    r = ChatRenderer(_tok_with(tok_path, trim))
    segs = r.segments(CONV, AGENT)
    assert r.tokenizer.decode(segs[0][1]) == "Thought: east.\nAction: move east" + EOT
    assert r.render(CONV).startswith(r.tokenizer.decode(full_sequence(segs)[0]))
    plain = "{% for m in messages %}{{ m['role'] + ': ' + m['content'] + '\\n\\n' }}{% endfor %}" \
            "{% if add_generation_prompt %}assistant: {% endif %}"
    r = ChatRenderer(_tok_with(tok_path, plain))
    segs = r.segments(CONV, AGENT)
    assert r.tokenizer.decode(segs[0][1]) == CONV[4]["content"]  # nothing closes the turn
    assert r.tokenizer.decode(segs[1][0]).startswith("\n\nuser: ")


@pytest.mark.parametrize("template", [
    "{{ messages | length }}" + CHAT_TEMPLATE,  # the header changes as the chat grows
    "{% for m in messages | reverse %}{{ m['role'] + m['content'] }}{% endfor %}"
    "{% if add_generation_prompt %}A:{% endif %}",
    CHAT_TEMPLATE.replace("<|im_start|>assistant\\n' }}{% endif %}", "<|im_start|>assistant\\n<think>' }}{% endif %}"),
])
def test_unstable_templates_are_refused(tok_path, template):
    with pytest.raises(ChatTemplateError, match="prefix-stable"):
        ChatRenderer(_tok_with(tok_path, template)).segments(CONV, AGENT)


def test_misuse_is_refused(tok, tok_path):
    conv = ChatRenderer(tok).conversation()
    with pytest.raises(ChatTemplateError, match="at least one message"):
        conv.prompt()
    conv.add(CONV[1])
    with pytest.raises(ChatTemplateError, match="needs a prompt"):
        conv.reply("x")
    conv.prompt()
    with pytest.raises(ChatTemplateError, match="twice"):
        conv.prompt()
    with pytest.raises(ChatTemplateError, match="no chat template"):
        ChatRenderer(_tok_with(tok_path, ""))


def test_full_sequence_accepts_records_rows_and_pairs():
    pairs = [([1, 2], [3]), ([4], [5, 6])]
    want = ([1, 2, 3, 4, 5, 6], [0, 0, 1, 0, 1, 1])
    assert full_sequence(pairs) == want
    records = [Turn("e", i, prompt_token_ids=p, response_token_ids=r) for i, (p, r) in enumerate(pairs)]
    assert full_sequence(records) == want
    assert full_sequence([{"prompt_token_ids": p, "response_token_ids": r} for p, r in pairs]) == want


@pytest.mark.parametrize("text,action", [
    ("Thought:\nI go.\n\nAction:\nmove left\n", "move left"),
    ("Thought: Action: is a word\nAction: get 1 flint", "get 1 flint"),
    ("<think>x</think><action> move south </action>", "move south"),
    ("<act>click[buy]</act>", "click[buy]"),
    ("Thought:\nthis task cannot be completed.", None),
    ("Action:   ", None),
])
def test_parse_action(text, action):
    assert parse_action(text) == action


# ---- the importer on OpenManus-RL's real files -----------------------------------------------
def _real_files() -> list[Path]:
    files = sorted(AGENTGYM.glob("*/*.parquet"))
    if not files:
        pytest.skip(f"no AgentGym data under {AGENTGYM}")
    return files


@pytest.fixture(scope="module")
def real(tmp_path_factory, tok_path):
    files = _real_files()
    lake = Lake.open(str(tmp_path_factory.mktemp("real") / "lake"))
    result = import_agentgym(lake, files, str(tok_path), progress=False, chunk_size=400)
    yield lake, files, result
    lake.close()


def test_real_files_counts(real):
    lake, files, result = real
    rows = {f: read_records(f) for f in files}
    agent_msgs = {f: sum(m["from"] == "gpt" and m["loss"] is True for r in rs for m in r["conversations"])
                  for f, rs in rows.items()}
    for f in files:
        assert result.per_file[str(f)] == {"episodes": len(rows[f]), "turns": agent_msgs[f]}
    assert lake.count("episodes") == result.episodes == result.episodes_inserted == sum(map(len, rows.values()))
    assert lake.count("turns") == result.turns == sum(agent_msgs.values())
    by_env = dict(lake.query("SELECT env, count(*) AS n FROM episodes GROUP BY env").iter_rows())
    assert by_env == {env: sum(len(rows[f]) for f in files if f.parent.name == env) for env in by_env}
    assert lake.count("tasks") == len({(f.stem, r["item_id"]) for f, rs in rows.items() for r in rs})
    by_split = lake.query("SELECT e.env, t.split, count(*) AS n FROM episodes e JOIN tasks t USING (task_id) "
                          "GROUP BY ALL").rows()
    assert sorted(by_split) == sorted((f.parent.name, f.stem, len(rows[f])) for f in files)
    assert lake.query("SELECT count(*) AS n FROM turns WHERE done")["n"][0] == result.episodes
    run = lake.query("SELECT kind, status, config FROM runs").row(0)
    assert run[:2] == ("import", "finished") and len(json.loads(run[2])["files"]) == len(files)
    assert lake.query("SELECT policy_id FROM policies")["policy_id"].to_list() == ["agentgym-expert"]


@pytest.mark.slow  # 6 s per order: the real files imported twice
@pytest.mark.parametrize("order", [("val", "train"), ("train", "val")])
def test_each_episode_keeps_its_files_split_whatever_the_import_order(order, tmp_path, tok_path):
    """OpenManus-RL's babyai val and train files share 20 item ids: each file's episodes keep its split."""
    files = [AGENTGYM / "babyai" / f"{split}.parquet" for split in order]
    if not all(f.is_file() for f in files):
        pytest.skip(f"no babyai data under {AGENTGYM}")
    with Lake.open(str(tmp_path / "lake")) as lake:
        for f in files:  # one import per file, in this order
            import_agentgym(lake, [f], str(tok_path), progress=False)
        got = dict(lake.query("SELECT t.split, count(*) AS n FROM episodes e JOIN tasks t USING (task_id) "
                              "GROUP BY ALL").rows())
    assert got == {f.stem: len(read_records(f)) for f in files}


def test_real_files_token_exact(real, tok):
    lake, files, _ = real
    renderer = ChatRenderer(tok)
    turns = lake.query("SELECT t.*, e.env, e.num_agent_tokens FROM turns t JOIN episodes e USING (episode_id) "
                       "ORDER BY episode_id, turn")
    rows = {(f.parent.name, f.name): read_records(f) for f in files}
    checked = 0
    for (eid,), ep in turns.group_by(["episode_id"], maintain_order=True):
        ep = ep.to_dicts()
        src = json.loads(ep[0]["info"])
        row = rows[(ep[0]["env"], src["source_file"])][src["source_row"]]
        messages = [{"role": ROLES[m["from"]], "content": m["value"]} for m in row["conversations"]]
        ids, mask = full_sequence(ep)
        text, full = tok.decode(ids), renderer.render(messages)
        assert full.startswith(text) and full[len(text):] == "\n", eid
        assert sum(mask) == ep[0]["num_agent_tokens"]
        for t in ep:
            assert tok.decode(t["response_token_ids"]) == t["action_text"] + EOT
            assert t["response_logprobs"] is None and t["format_ok"] == (t["action"] is not None)
        checked += 1
    assert checked == lake.count("episodes")


def test_real_files_reimport_inserts_nothing(real, tok_path):
    lake, files, first = real
    before = lake.current_snapshot()
    again = import_agentgym(lake, files, str(tok_path), progress=False)
    assert again.run_id == first.run_id
    assert sum(again.inserted.values()) == 0 and again.episodes_skipped == first.episodes
    assert again.snapshots == () and lake.current_snapshot() == before


# ---- the importer on files written here ------------------------------------------------------
def _row(i: int, **over) -> dict:
    conv = [
        {"from": "human", "loss": None, "value": "You are a crafter."},
        {"from": "gpt", "loss": False, "value": "OK. I'll follow your instructions."},
        {"from": "human", "loss": None, "value": f"Goal: craft item {i}."},
        {"from": "gpt", "loss": True, "value": "Thought:\nI check.\n\nAction:\ninventory"},
        {"from": "human", "loss": None, "value": "Inventory: empty."},
        {"from": "gpt", "loss": True, "value": f"<think>get it</think><action>get {i} stick</action>"},
    ]
    row = {"data_source": "textcraft", "item_id": f"textcraft_{i}", "conversations": conv,
           "reward_model": {"style": "rule", "ground_truth": json.dumps({"item": i})},
           "extra_info": {"split": "textcraft", "index": i}, "prompt": [{"role": "user", "content": "hi"}]}
    row.update(over)
    return row


def _write(path: Path, rows: list[dict]) -> Path:
    if path.suffix == ".jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    elif path.suffix == ".json":
        path.write_text(json.dumps(rows))
    else:
        pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def test_jsonl_json_and_parquet_written_here(tmp_path, tok_path):
    lake = Lake.open(str(tmp_path / "lake"))
    jl = _write(tmp_path / "train.jsonl", [_row(1, reward=1.0), _row(2, reward=0)])
    loose = [{"from": "user", "value": "Find the key."}, {"from": "assistant", "value": "Action: look"},
             {"from": "system", "value": "You see a key."}, {"from": "assistant", "value": "no action here"},
             {"from": "human", "value": "Time is up."}]
    js = _write(tmp_path / "val.json", [{"item_id": "babyai_7", "conversations": loose, "success": False}])
    pa_ = _write(tmp_path / "test.parquet", [_row(3)])
    res = import_agentgym(lake, [jl, js, pa_], str(tok_path), progress=True, chunk_size=2)
    assert (res.episodes, res.turns, res.episodes_inserted) == (4, 8, 4)
    assert len(res.snapshots) == 3  # two chunks, then the run is marked finished
    eps = {r["task_id"]: r for r in lake.query("SELECT * FROM episodes").to_dicts()}
    assert [eps[t]["success"] for t in ("train/textcraft_1", "train/textcraft_2", "test/textcraft_3")] == [
        True, False, None]
    assert eps["train/textcraft_1"]["env_reward"] == 1.0 and eps["val/babyai_7"]["env"] == "babyai"
    assert eps["val/babyai_7"]["success"] is False and eps["val/babyai_7"]["num_turns"] == 2
    tasks = {r["task_id"]: r for r in lake.query("SELECT * FROM tasks").to_dicts()}
    assert [tasks[t]["split"] for t in ("train/textcraft_1", "val/babyai_7", "test/textcraft_3")] == [
        "train", "val", "test"]
    assert json.loads(tasks["train/textcraft_1"]["ground_truth"]) == {"item": 1}
    assert tasks["train/textcraft_1"]["instruction"] == "You are a crafter.\n\nGoal: craft item 1."
    t = lake.query("SELECT * FROM turns ORDER BY episode_id, turn").to_dicts()
    by_ep = {}
    for x in t:
        by_ep.setdefault(x["episode_id"], []).append(x)
    bab = by_ep[eps["val/babyai_7"]["episode_id"]]  # null loss everywhere: every gpt message is an agent turn
    assert [(x["action"], x["format_ok"], x["done"]) for x in bab] == [("look", True, False), (None, False, True)]
    assert bab[1]["observation"] == "You see a key."
    assert json.loads(bab[1]["info"])["after_last_turn"] == [{"role": "user", "content": "Time is up."}]
    tc = by_ep[eps["train/textcraft_1"]["episode_id"]]
    assert [x["action"] for x in tc] == ["inventory", "get 1 stick"]
    assert tc[0]["observation"] == "You are a crafter.\n\nGoal: craft item 1."  # the "OK" reply is context
    assert "OK. I'll follow" in AutoTokenizer.from_pretrained(tok_path).decode(tc[0]["prompt_token_ids"])
    again = import_agentgym(lake, [jl, js, pa_], str(tok_path), progress=False)
    assert again.inserted.get("episodes") == 0 and again.snapshots == ()


def test_explicit_true_loss_makes_null_replies_context(tmp_path, tok_path):
    row = _row(5)
    row["conversations"][3]["loss"] = None  # true elsewhere in the row: this reply is context
    lake = Lake.open(str(tmp_path / "lake"))
    res = import_agentgym(lake, _write(tmp_path / "a.jsonl", [row]), str(tok_path), progress=False)
    assert res.turns == 1
    assert lake.query("SELECT observation FROM turns")["observation"][0] == \
        "You are a crafter.\n\nGoal: craft item 5.\n\nInventory: empty."


def test_interrupted_import_resumes_and_copies_are_skipped(tmp_path, tok_path):
    lake = Lake.open(str(tmp_path / "lake"))
    src = _write(tmp_path / "train.jsonl", [_row(i) for i in range(5)])
    real_append, calls = lake.append, []

    def dies_on_second_chunk(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real_append(*args, **kwargs)

    lake.append = dies_on_second_chunk
    with pytest.raises(KeyboardInterrupt):
        import_agentgym(lake, src, str(tok_path), progress=False, chunk_size=2)
    assert (lake.count("episodes"), lake.count("turns")) == (2, 4)  # whole episodes only
    assert lake.query("SELECT status FROM runs")["status"].to_list() == ["failed"]  # as any stage cut short
    assert any("failed: KeyboardInterrupt" in (m or "") for m in lake.snapshots()["message"].to_list())
    lake.append = real_append
    res = import_agentgym(lake, src, str(tok_path), progress=False, chunk_size=2)  # the same run resumes
    assert (res.episodes_inserted, res.episodes_skipped, res.turns_inserted) == (3, 2, 6)
    assert lake.query("SELECT status FROM runs")["status"].to_list() == ["finished"]
    copy = _write(tmp_path / "copy.jsonl", [_row(i) for i in range(5)])  # same content, same episode ids
    before = lake.current_snapshot()
    res = import_agentgym(lake, [src, copy], str(tok_path), progress=False)
    assert (res.episodes, res.episodes_inserted, res.episodes_skipped) == (10, 0, 10)
    assert lake.current_snapshot() == before and lake.count("runs") == 1 and lake.count("episodes") == 5


# ---- refusals: clear message, lake unchanged ---------------------------------------------------
def _bad(kind: str, tmp: Path, tok_path: Path):
    """(paths, tokenizer, expected message pattern) for one failure path."""
    good = _write(tmp / "good.jsonl", [_row(9)])
    conv = _row(0)["conversations"]
    rows = {
        "no_agent": [_row(0, conversations=[m for m in conv if m["from"] == "human"])],
        "no_from": [_row(0, conversations=[{"value": "hi"}] + conv)],
        "no_value": [_row(0, conversations=conv[:2] + [{"from": "human", "value": None}] + conv[2:])],
        "unknown_role": [_row(0, conversations=conv[:4] + [{"from": "tool", "value": "x"}] + conv[4:])],
        "no_conversations": [{"item_id": "x_1"}],
    }
    if kind in rows:
        pats = {"no_agent": "row 0: no agent turn", "no_from": "row 0 message 0: no `from`",
                "no_value": "row 0 message 2: no `value`", "unknown_role": "row 0 message 4: unknown role 'tool'",
                "no_conversations": "no `conversations`"}
        return [good, _write(tmp / f"{kind}.jsonl", rows[kind])], tok_path, pats[kind]
    if kind == "missing_file":
        return [good, tmp / "nope.jsonl"], tok_path, "nope.jsonl: no such file"
    if kind == "extension":
        (tmp / "data.csv").write_text("a,b\n")
        return [good, tmp / "data.csv"], tok_path, "data.csv: unsupported file type '.csv'"
    if kind == "corrupt_parquet":
        (tmp / "bad.parquet").write_bytes(b"PAR1 this is not parquet")
        return [good, tmp / "bad.parquet"], tok_path, "bad.parquet: not a readable parquet file"
    if kind == "parquet_no_column":
        pq.write_table(pa.table({"item_id": ["a_1"]}), tmp / "nocol.parquet")
        return [good, tmp / "nocol.parquet"], tok_path, r"nocol.parquet: no `conversations` column \(columns: item_id\)"
    if kind == "corrupt_json":
        (tmp / "bad.json").write_text('[{"conversations": [}')
        return [good, tmp / "bad.json"], tok_path, "bad.json: invalid JSON at line 1"
    if kind == "json_not_list":
        (tmp / "obj.json").write_text('{"conversations": []}')
        return [good, tmp / "obj.json"], tok_path, "must hold a list of objects"
    if kind == "corrupt_jsonl":
        (tmp / "bad.jsonl").write_text(json.dumps(_row(1)) + "\n{oops\n")
        return [good, tmp / "bad.jsonl"], tok_path, "bad.jsonl: line 2 is not valid JSON"
    if kind == "tokenizer_missing":
        return [good], tmp / "no_such_tokenizer", "tokenizer path .*no_such_tokenizer: no such folder"
    if kind == "tokenizer_broken":
        (tmp / "empty_tok").mkdir()
        return [good], tmp / "empty_tok", "cannot load tokenizer from .*empty_tok"
    raise AssertionError(kind)


@pytest.fixture(scope="module")
def seeded(tmp_path_factory, tok_path):
    tmp = tmp_path_factory.mktemp("seeded")
    lake = Lake.open(str(tmp / "lake"))
    import_agentgym(lake, _write(tmp / "seed.jsonl", [_row(1), _row(2)]), str(tok_path), progress=False)
    yield lake
    lake.close()


@pytest.mark.parametrize("kind", [
    "missing_file", "extension", "corrupt_parquet", "parquet_no_column", "corrupt_json", "json_not_list",
    "corrupt_jsonl", "no_conversations", "no_agent", "no_from", "no_value", "unknown_role",
    "tokenizer_missing", "tokenizer_broken",
])
def test_bad_input_is_refused_before_anything_is_written(kind, seeded, tmp_path, tok_path):
    paths, tokenizer, pattern = _bad(kind, tmp_path, tok_path)
    before = (seeded.current_snapshot(), {t: seeded.count(t) for t in ("episodes", "turns", "tasks", "runs")})
    with pytest.raises(TrajectoryImportError, match=pattern) as err:
        import_agentgym(seeded, paths, str(tokenizer), progress=False)
    assert isinstance(err.value, TrajlakeError)
    assert (seeded.current_snapshot(), {t: seeded.count(t) for t in before[1]}) == before

