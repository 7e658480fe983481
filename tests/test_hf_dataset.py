"""Episodes as a Hugging Face `datasets` dataset (interop/hf_dataset.py): export, load with `datasets` both ways,
import into a fresh lake, equal episodes and turns (a Minari-style round trip); the token columns match the
stored turns and the spec's allocation; bad inputs leave the lakes as they were."""

from __future__ import annotations

import json

import pytest

from tests.helpers import tiny_model_dir
from trajlake.collect.config import CollectConfig
from trajlake.collect.rollout import collect
from trajlake.core.errors import TrajlakeError
from trajlake.interop.hf_dataset import export_dataset, import_dataset
from trajlake.rewards import default_spec
from trajlake.store import Lake

datasets = pytest.importorskip("datasets")
pytestmark = pytest.mark.usefixtures("one_torch_thread")

TURN_COLUMNS = ("episode_id, turn, observation, action_text, action, format_ok, step_reward, done, info::VARCHAR, "
                "prompt_token_ids, response_token_ids, response_logprobs, latency_ms, num_prompt_tokens, "
                "num_response_tokens")


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    """A lake with a model's multi-turn episodes (exact ids and log-probs) and a scripted expert's (text)."""
    model = tiny_model_dir(tmp_path_factory)
    lake = Lake.open(str(tmp_path_factory.mktemp("src") / "lake"))
    common = dict(env="doors", difficulty=3, max_turns=3, template="action", progress=False)
    collect(CollectConfig(policy=f"hf:{model}", tasks=3, samples=2, max_new_tokens=8, run_id="model", **common),
            lake)
    collect(CollectConfig(policy="scripted:doors", tokenizer=str(model), tasks=2, run_id="expert", **common), lake)
    yield lake
    lake.close()


def table(lake: Lake, sql: str) -> list[dict]:
    return lake.query(sql).to_dicts()


def test_round_trip_into_a_fresh_lake_gives_equal_episodes(source, tmp_path):
    n = export_dataset(source, tmp_path / "ds", spec=default_spec())
    assert n == 8
    with Lake.open(str(tmp_path / "copy")) as copy:
        got = import_dataset(copy, tmp_path / "ds")
        assert got["episodes"] == 8 and got["runs"] == 2 and got["tasks"] == 3  # the expert played 2 of the 3
        for sql in ("SELECT * FROM episodes ORDER BY episode_id",
                    f"SELECT {TURN_COLUMNS} FROM turns ORDER BY episode_id, turn",
                    "SELECT task_id, env, split, instruction, seed, ground_truth::VARCHAR AS g FROM tasks ORDER BY 1",
                    "SELECT run_id, kind, config::VARCHAR AS c FROM runs ORDER BY 1"):
            assert table(copy, sql) == table(source, sql), sql
        again = import_dataset(copy, tmp_path / "ds")  # idempotent: nothing twice
        assert again["episodes"] == 0 and copy.count("episodes") == 8


def test_the_dataset_loads_with_datasets_both_ways_in_the_peers_formats(source, tmp_path):
    # `where` is over episodes columns alone, though runs and tasks have some of the same names (env, run_id)
    export_dataset(source, tmp_path / "ds", where="run_id = 'model' AND env = 'doors'", spec=default_spec())
    on_disk = datasets.load_from_disk(str(tmp_path / "ds"))
    parquet = datasets.load_dataset("parquet", data_files=str(tmp_path / "ds" / "episodes.parquet"), split="train")
    assert on_disk.num_rows == parquet.num_rows == 6 and on_disk.column_names == parquet.column_names
    row = on_disk[0]
    turns = source.query("SELECT * FROM turns WHERE episode_id = ? ORDER BY turn", [row["episode_id"]]).to_dicts()
    system = json.loads(source.query("SELECT config FROM runs WHERE run_id = 'model'").item())["system_prompt"]
    assert row["messages"][0] == {"role": "system", "content": system}
    assert [m["role"] for m in row["messages"][1:]] == ["user", "assistant"] * len(turns)
    assert [m["content"] for m in row["messages"][2::2]] == [t["action_text"] for t in turns]
    assert [(c["from"], c["loss"]) for c in row["conversations"][1:3]] == [("human", False), ("gpt", True)]
    ids = [i for t in turns for i in list(t["prompt_token_ids"]) + list(t["response_token_ids"])]
    assert row["input_ids"] == ids and sum(row["loss_mask"]) == sum(len(t["response_token_ids"]) for t in turns)
    sampled = [lp for lp, m in zip(row["behaviour_logprobs"], row["loss_mask"], strict=True) if m]
    assert sampled == pytest.approx([x for t in turns for x in t["response_logprobs"]])
    allocated = source.query("SELECT position, reward FROM token_rewards WHERE spec_id = ? AND episode_id = ?",
                             [default_spec().spec_id, row["episode_id"]]).rows()
    assert [(k, v) for k, v in enumerate(row["token_rewards"]) if v] == [(k, v) for k, v in allocated if v]
    assert row["reward"] == pytest.approx(sum(row["token_rewards"]))


def test_bad_inputs_name_the_problem_and_change_nothing(source, tmp_path):
    before = source.snapshots().height
    with pytest.raises(TrajlakeError, match="selects no episode"):
        export_dataset(source, tmp_path / "none", where="false")
    with pytest.raises(TrajlakeError, match="--where"):
        export_dataset(source, tmp_path / "bad", where="no_such_column = 1")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("keep me")
    with pytest.raises(TrajlakeError, match="exists and is not empty"):
        export_dataset(source, tmp_path / "full")
    assert (tmp_path / "full" / "x").read_text() == "keep me" and source.snapshots().height == before
    datasets.Dataset.from_list([{"a": 1}]).save_to_disk(str(tmp_path / "other"))
    with Lake.open(str(tmp_path / "copy")) as copy:
        with pytest.raises(TrajlakeError, match="not a trajlake episode dataset"):
            import_dataset(copy, tmp_path / "other")
        with pytest.raises(TrajlakeError, match="no dataset here"):
            import_dataset(copy, tmp_path / "empty-dir")
        assert copy.count("episodes") == 0


def test_cli_export_and_import(source, tmp_path, capsys):
    from trajlake.cli import main

    uri = str(tmp_path / "cli-src")
    with Lake.open(uri) as lake:  # a copy of the source lake the CLI can open (one process at a time)
        export_dataset(source, tmp_path / "seed")
        import_dataset(lake, tmp_path / "seed")
    assert main(["--lake", uri, "export", str(tmp_path / "out"), "--dataset", "--where", "run_id = 'expert'"]) == 0
    assert "2 episodes exported" in capsys.readouterr().out
    assert main(["--lake", str(tmp_path / "dst"), "import", "dataset", str(tmp_path / "out")]) == 0
    assert "episodes: 2" in capsys.readouterr().out
    with Lake.open(str(tmp_path / "dst")) as dst:
        assert dst.query("SELECT DISTINCT policy_id FROM episodes").item() == "scripted:doors"


def test_an_export_made_a_batch_at_a_time_is_the_export_made_at_once(source, tmp_path, monkeypatch):
    """Batches of one episode: a model's (log-probs) and an expert's (none: a null column in its batch) meet in
    one table, typed by the others, and the dataset equals the one made from all the rows at once."""
    import pyarrow.parquet as pq

    from trajlake.interop import hf_dataset

    monkeypatch.setattr(hf_dataset, "EXPORT_BATCH", 1)
    assert export_dataset(source, tmp_path / "one", spec=default_spec()) == 8
    monkeypatch.setattr(hf_dataset, "EXPORT_BATCH", 10_000)
    assert export_dataset(source, tmp_path / "all", spec=default_spec()) == 8
    one, whole = (pq.read_table(tmp_path / d / hf_dataset.PARQUET) for d in ("one", "all"))
    assert one.schema == whole.schema and one.to_pylist() == whole.to_pylist()
    assert sum(1 for r in whole.to_pylist() if all(v is None for v in r["behaviour_logprobs"])) == 2  # the expert's
    with Lake.open(str(tmp_path / "copy")) as copy:
        assert import_dataset(copy, tmp_path / "one")["episodes"] == 8


def _state(name: str, edit):
    def apply(folder):
        path = folder / "state.json"
        if name == "not json":
            path.write_text("not json")
        elif name == "nested":
            path.write_text("[" * 100_000 + "]" * 100_000)
        elif name == "truncated arrow":
            arrow = folder / "data-00000-of-00001.arrow"
            arrow.write_bytes(arrow.read_bytes()[:1000])
        else:
            state = json.loads(path.read_text())
            edit(state, folder)
            path.write_text(json.dumps(state))
    return apply


def _outside(state, folder):
    (folder.parent / "elsewhere.arrow").write_bytes((folder / "data-00000-of-00001.arrow").read_bytes())
    state["_data_files"] = [{"filename": str(folder.parent / "elsewhere.arrow")}]


def _symlink(state, folder):
    (folder / "link.arrow").symlink_to(folder / "data-00000-of-00001.arrow")
    state["_data_files"] = [{"filename": "link.arrow"}]


HOSTILE_STATES = [
    ("absolute path", _outside, "is not a file of"),
    ("../ path", lambda s, f: s.update(_data_files=[{"filename": "../x/data-00000-of-00001.arrow"}]),
     "is not a file of"),
    ("device", lambda s, f: s.update(_data_files=[{"filename": "/dev/zero"}]), "is not a file of"),
    ("symlink", _symlink, "is not a file of"),
    ("missing file", lambda s, f: s.update(_data_files=[{"filename": "nosuch.arrow"}]), "is not a file of"),
    ("no _data_files", lambda s, f: s.pop("_data_files"), "is not a list"),
    ("_data_files a string", lambda s, f: s.update(_data_files="x"), "is not a list"),
    ("not json", None, "not JSON"),
    ("nested", None, "nests too deep"),
    ("truncated arrow", None, "not a dataset save_to_disk wrote"),
]


@pytest.mark.parametrize("name,edit,message", HOSTILE_STATES, ids=[h[0] for h in HOSTILE_STATES])
def test_a_hostile_saved_dataset_is_refused_naming_the_problem(source, name, edit, message, tmp_path):
    """`load_from_disk` joins each `_data_files` name to the folder as it is: an absolute name or `../` read an
    Arrow file from anywhere (imported with exit 0), and a malformed state was a bare KeyError or TypeError."""
    folder = tmp_path / "ds"
    export_dataset(source, folder)
    _state(name, edit)(folder)
    with Lake.open(str(tmp_path / "copy")) as copy:
        with pytest.raises(TrajlakeError, match=message):
            import_dataset(copy, folder)
        assert copy.count("episodes") == 0
