"""HFPolicy's prefix cache (collect.policies.hf): each episode's keys and values are kept between turns, so a
turn feeds only its new tokens; the replies and logprobs must be exactly those of the uncached path
(model.generate over the full context) and of a plain forward pass over the whole sequence.

The tiny model (random weights, built once per session) plays several episodes of different lengths in one
batch over several turns; each turn's new prompt is random ids appended to the context so far."""

from __future__ import annotations

import pytest
import torch

from trajlake.collect.policies import Request, SamplingParams
from trajlake.collect.policies.hf import HFPolicy
from trajlake.lm.load import load_model, load_tokenizer
from trajlake.lm.prefix import cache_unsupported

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def loaded(tiny):
    return load_model(tiny), load_tokenizer(tiny)


def policy(tiny, loaded, **kw) -> HFPolicy:
    model, tokenizer = loaded
    return HFPolicy(tiny, model=model, tokenizer=tokenizer, **kw)


class Fed:
    """Counts the ids the cached decoder feeds the model (prefill and decode) of a policy."""

    def __init__(self, pol: HFPolicy):
        self.prefill, self.widths, self.decode = 0, [], 0
        forward = pol._forward

        def counting(cache, ids, cols, span):
            if ids.shape[1] > 1:
                self.prefill += ids.numel()
                self.widths.append(ids.shape[1])
            else:
                self.decode += 1
            assert span == int(cols.max()) + 1
            return forward(cache, ids, cols, span)

        pol._forward = counting


def rand_ids(gen: torch.Generator, n: int) -> list[int]:
    return torch.randint(3, 2000, (n,), generator=gen).tolist()


def forward_logprobs(model, context: list[int], reply: list[int], temperature: float) -> list[float]:
    """The model's logprobs of `reply` after `context`, from one forward pass over the whole sequence."""
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([context + reply])).logits[0].float()
    if temperature > 0:
        logits = logits / temperature
    logp = torch.log_softmax(logits, dim=-1)
    return [logp[len(context) + i - 1, t].item() for i, t in enumerate(reply)]


def play(pols, contexts: dict[str, list[int]], params: SamplingParams, turns: int, gen: torch.Generator,
         check=None) -> list[list]:
    """Multi-turn: every turn each policy answers every episode's full context; the first policy's reply and
    some new random prompt ids extend the context. Returns each turn's generations of every policy."""
    history = []
    for turn in range(turns):
        reqs = [Request(key, list(ctx), []) for key, ctx in contexts.items()]
        outs = [p.generate(reqs, params) for p in pols]
        history.append(outs)
        if check:
            check(turn, reqs, outs)
        for (key, ctx), g in zip(list(contexts.items()), outs[0], strict=True):
            contexts[key] = ctx + g.token_ids + rand_ids(gen, 3 + (turn * 5 + len(key)) % 11)
    return history


def test_cached_greedy_equals_uncached_token_for_token(tiny, loaded):
    """5 episodes of different lengths, 5 turns, greedy: same ids as the uncached path, logprobs of the
    forward pass; after the first turn only the new ids (and the last reply's last id) are fed."""
    model = loaded[0]
    cached, plain = policy(tiny, loaded), policy(tiny, loaded, prefix_cache=False)
    assert cached.cache_off is None and plain.cache_off == "prefix_cache=False"
    fed = Fed(cached)
    gen = torch.Generator().manual_seed(1)
    contexts = {f"ep{i}": rand_ids(gen, 6 + 17 * i) for i in range(5)}
    params = SamplingParams(temperature=0, max_new_tokens=9)

    def check(turn, reqs, outs):
        for req, a, b in zip(reqs, *outs, strict=True):
            assert a.token_ids == b.token_ids, (turn, req.key)
            assert a.finish_reason == b.finish_reason
            assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)
            assert a.logprobs == pytest.approx(forward_logprobs(model, req.prompt_ids, a.token_ids, 0), abs=1e-4)
            # the slot covers the context and the reply but its last id
            assert cached.cached_ids(req.key) == req.prompt_ids + a.token_ids[:-1]
        if turn > 0:  # the turn's new ids plus the previous reply's last id; nothing of the history
            assert fed.widths[-1] == max(3 + ((turn - 1) * 5 + 3) % 11 for _ in reqs) + 1

    play([cached, plain], contexts, params, 5, gen, check)
    assert len(fed.widths) == 5 and fed.decode == 5 * 8


@pytest.mark.parametrize("temperature, top_p", [(0.7, 1.0), (1.0, 0.9)])
def test_sampled_logprobs_are_the_forward_pass(tiny, loaded, temperature, top_p):
    model = loaded[0]
    cached = policy(tiny, loaded)
    gen = torch.Generator().manual_seed(2)
    contexts = {f"s{i}": rand_ids(gen, 10 + 23 * i) for i in range(4)}
    params = SamplingParams(temperature=temperature, top_p=top_p, max_new_tokens=12, seed=5)

    def check(turn, reqs, outs):
        for req, g in zip(reqs, outs[0], strict=True):
            assert len(g.token_ids) == len(g.logprobs) == 12 and g.finish_reason == "length"
            want = forward_logprobs(model, req.prompt_ids, g.token_ids, temperature)
            assert g.logprobs == pytest.approx(want, abs=1e-4)

    play([cached], contexts, params, 4, gen, check)


def test_sampling_is_seeded_and_reset_rng_restarts_it(tiny, loaded):
    gen = torch.Generator().manual_seed(3)
    contexts = {f"r{i}": rand_ids(gen, 20 + 5 * i) for i in range(3)}
    reqs = [Request(k, v, []) for k, v in contexts.items()]

    def sample(pol, seed):
        return [g.token_ids for g in pol.generate(reqs, SamplingParams(1.0, 1.0, 10, seed))]

    first = policy(tiny, loaded)
    a = sample(first, 4)
    assert sample(policy(tiny, loaded), 4) == a  # a fresh policy, the same seed: the same samples
    assert sample(policy(tiny, loaded), 5) != a
    assert sample(first, 4) != a  # the stream goes on (the seed is taken once)...
    first.reset_rng(4)
    assert sample(first, 4) == a  # ...until reset


def test_end_episode_drops_the_cache(tiny, loaded):
    pol = policy(tiny, loaded)
    gen = torch.Generator().manual_seed(4)
    reqs = [Request("a", rand_ids(gen, 30), []), Request("b", rand_ids(gen, 40), [])]
    pol.generate(reqs, SamplingParams(temperature=0, max_new_tokens=5))
    assert pol.cached_ids("a") is not None and pol.cached_ids("b") is not None
    pol.end_episode("a")
    assert pol.cached_ids("a") is None and pol.cached_ids("b") is not None
    pol.end_episode("a")  # twice is fine
    pol.end_episode("never-seen")
    # a new episode takes the freed slot (the buffer does not grow) and is read whole
    held = pol.cache_bytes
    fed = Fed(pol)
    c = [Request("c", rand_ids(gen, 30), [])]
    again = pol.generate(c, SamplingParams(temperature=0, max_new_tokens=5))
    plain = policy(tiny, loaded, prefix_cache=False).generate(c, SamplingParams(temperature=0, max_new_tokens=5))
    assert again[0].token_ids == plain[0].token_ids and fed.prefill == 30
    assert pol.cache_bytes == held and pol.cached_ids("a") is None
    assert pol.cached_ids("b") == reqs[1].prompt_ids + pol.cached_ids("b")[40:]  # b was not touched
    for key in ("b", "c"):
        pol.end_episode(key)
    assert pol.cached_ids("b") is None and pol.cached_ids("c") is None
    pol.clear_cache()
    assert pol.cache_bytes == 0


def test_prompt_not_extending_the_cache_falls_back(tiny, loaded):
    """A context that differs from what is cached (rewritten history, a shorter one, another episode's under
    the same key) is read again from where it differs, and the replies are those of the uncached path."""
    model = loaded[0]
    cached, plain = policy(tiny, loaded), policy(tiny, loaded, prefix_cache=False)
    fed = Fed(cached)
    gen = torch.Generator().manual_seed(5)
    params = SamplingParams(temperature=0, max_new_tokens=6)
    base = {k: rand_ids(gen, n) for k, n in (("x", 40), ("y", 55), ("z", 25), ("w", 30))}
    first = cached.generate([Request(k, v, []) for k, v in base.items()], params)
    ctx = {k: v + g.token_ids for (k, v), g in zip(base.items(), first, strict=True)}
    turn2 = {
        "x": ctx["x"][:20] + [7] + ctx["x"][21:] + rand_ids(gen, 4),  # rewritten in the middle
        "y": ctx["y"][:30],  # shorter: a prefix of what is cached
        "z": rand_ids(gen, 35),  # nothing in common
        "w": ctx["w"] + rand_ids(gen, 5),  # extends: the cache is used
    }
    fed.prefill = 0
    reqs = [Request(k, v, []) for k, v in turn2.items()]
    a, b = cached.generate(reqs, params), plain.generate(reqs, params)
    for req, x, y in zip(reqs, a, b, strict=True):
        assert x.token_ids == y.token_ids, req.key
        assert x.logprobs == pytest.approx(forward_logprobs(model, req.prompt_ids, x.token_ids, 0), abs=1e-4)
        assert cached.cached_ids(req.key) == req.prompt_ids + x.token_ids[:-1]
    # re-read: x from its 21st id, y its last id only, z all of it, w its 5 new ids and the reply's last id
    news = {"x": len(turn2["x"]) - 20, "y": 1, "z": 35, "w": 6}
    assert fed.widths[-1] == max(news.values())


def test_shared_prefix_is_read_once(tiny, loaded):
    """New episodes starting with the same system prompt: it is read once; a later episode starts from what
    an ended one left in its slot. Same replies as the uncached path."""
    model = loaded[0]
    cached, plain = policy(tiny, loaded), policy(tiny, loaded, prefix_cache=False)
    fed = Fed(cached)
    gen = torch.Generator().manual_seed(6)
    system = rand_ids(gen, 80)
    prompts = {f"g{i}": system + rand_ids(gen, 3 + i) for i in range(6)}
    prompts["same-as-g0"] = list(prompts["g0"])  # a group of samples of one task: the whole prompt is shared
    params = SamplingParams(temperature=0, max_new_tokens=5)
    reqs = [Request(k, v, []) for k, v in prompts.items()]
    a, b = cached.generate(reqs, params), plain.generate(reqs, params)
    for req, x, y in zip(reqs, a, b, strict=True):
        assert x.token_ids == y.token_ids
        assert x.logprobs == pytest.approx(forward_logprobs(model, req.prompt_ids, x.token_ids, 0), abs=1e-4)
    assert fed.prefill < 80 + 7 * 20  # the system prompt once (not 7 times), then each row's rest
    for key in prompts:
        cached.end_episode(key)
    fed.prefill = 0
    late = [Request("late", system + rand_ids(gen, 9), [])]
    x, y = cached.generate(late, params)[0], plain.generate(late, params)[0]
    assert x.token_ids == y.token_ids and fed.prefill == 9  # the system prompt came from a free slot


def test_rows_stopping_at_different_steps(tiny, loaded):
    """Rows that hit a stop id at different steps end there (the others go on), as in the uncached path."""
    cached, plain = policy(tiny, loaded), policy(tiny, loaded, prefix_cache=False)
    gen = torch.Generator().manual_seed(7)
    reqs = [Request(f"t{i}", rand_ids(gen, 15 + 9 * i), []) for i in range(6)]
    params = SamplingParams(temperature=0, max_new_tokens=12)
    free_run = plain.generate(reqs, params)
    stop = sorted({g.token_ids[3] for g in free_run[:2]} | {g.token_ids[7] for g in free_run[2:4]})
    cached.stop = plain.stop = stop
    for turn in range(3):
        a, b = cached.generate(reqs, params), plain.generate(reqs, params)
        assert [(g.token_ids, g.finish_reason) for g in a] == [(g.token_ids, g.finish_reason) for g in b]
        for x, y in zip(a, b, strict=True):
            assert x.logprobs == pytest.approx(y.logprobs, abs=1e-4)
        assert {g.finish_reason for g in a} == {"stop", "length"} or turn > 0
        reqs = [Request(r.key, r.prompt_ids + g.token_ids + rand_ids(gen, 4), []) for r, g in zip(reqs, a,
                                                                                                   strict=True)]


def test_batches_of_max_batch_rows_and_repeated_keys(tiny, loaded):
    """More requests than max_batch (several batches, each on its own slots) and one key asked twice in a
    batch: the same replies as the uncached path, turn after turn."""
    cached = policy(tiny, loaded, max_batch=3)
    plain = policy(tiny, loaded, prefix_cache=False)
    gen = torch.Generator().manual_seed(8)
    contexts = {f"m{i}": rand_ids(gen, 8 + 11 * i) for i in range(7)}
    params = SamplingParams(temperature=0, max_new_tokens=6)
    for _turn in range(3):
        reqs = [Request(k, list(v), []) for k, v in contexts.items()]
        again = Request("m0", list(contexts["m0"]), [])
        reqs = reqs[:1] + [again] + reqs[1:] + [again]  # twice in the first batch, once more in the last
        a, b = cached.generate(reqs, params), plain.generate(reqs, params)
        assert [g.token_ids for g in a] == [g.token_ids for g in b]
        assert a[0].token_ids == a[1].token_ids == a[-1].token_ids
        for (k, v), g in zip(list(contexts.items()), a[:1] + a[2:-1], strict=True):
            contexts[k] = v + g.token_ids + rand_ids(gen, 5)
    assert all(cached.cached_ids(k) is not None for k in contexts)


def test_memory_bound_evicts_least_recently_used(tiny, loaded):
    """With room for about two episodes besides a batch, older episodes are evicted (and read again when
    they come back), newer ones kept; replies do not change."""
    cached = policy(tiny, loaded)
    plain = policy(tiny, loaded, prefix_cache=False)
    cached.generate([Request("probe", [5, 6], [])], SamplingParams(temperature=0, max_new_tokens=1))
    col = cached._store.col_bytes
    cached.end_episode("probe")
    cached.clear_cache()
    cached.max_cache_bytes = 3 * 128 * col  # 3 slots of 128 columns
    cached._store = None
    gen = torch.Generator().manual_seed(9)
    params = SamplingParams(temperature=0, max_new_tokens=4)
    prompts = {f"e{i}": rand_ids(gen, 100) for i in range(5)}
    for key, ids in prompts.items():  # one episode at a time: e0, e1, ...
        req = [Request(key, ids, [])]
        assert cached.generate(req, params)[0].token_ids == plain.generate(req, params)[0].token_ids
    kept = [k for k in prompts if cached.cached_ids(k) is not None]
    assert kept == ["e2", "e3", "e4"]  # the most recent ones
    assert cached.cache_bytes <= 3 * 128 * col
    fed = Fed(cached)
    req = [Request("e0", prompts["e0"] + [1, 2], [])]  # e0 was evicted: read again, correctly
    assert cached.generate(req, params)[0].token_ids == plain.generate(req, params)[0].token_ids
    assert fed.prefill == 102


def test_eager_attention_and_unsupported_models(tiny):
    """The eager attention path (an additive float mask) gives the same replies; models the cached decoder
    cannot drive say why and use model.generate."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny, local_files_only=True)
    eager = AutoModelForCausalLM.from_pretrained(tiny, local_files_only=True, attn_implementation="eager").eval()
    cached = HFPolicy(tiny, model=eager, tokenizer=tok)
    plain = HFPolicy(tiny, model=eager, tokenizer=tok, prefix_cache=False)
    assert cached.cache_off is None
    gen = torch.Generator().manual_seed(10)
    contexts = {f"q{i}": rand_ids(gen, 12 + 20 * i) for i in range(3)}

    def check(turn, reqs, outs):
        assert [g.token_ids for g in outs[0]] == [g.token_ids for g in outs[1]]

    play([cached, plain], contexts, SamplingParams(temperature=0, max_new_tokens=6), 3, gen, check)

    eager.config.sliding_window = 16  # as a Mistral-style config says it
    try:
        assert cache_unsupported(eager) == "sliding-window attention"
        assert HFPolicy(tiny, model=eager, tokenizer=tok).cache_off == "sliding-window attention"
    finally:
        eager.config.sliding_window = None
    eager.config._attn_implementation = "flex_attention"
    assert "flex_attention" in cache_unsupported(eager)


@pytest.mark.parametrize("top_p, kept", [(1.0, 5), (0.75, 3), (0.3, 1)])
def test_sampler_top_p_and_frequencies(tiny, loaded, top_p, kept):
    """The sampler keeps transformers' top-p nucleus (the least likely ids holding at most 1 - top_p of the
    mass are dropped) and samples in proportion within it; logprobs are those before truncation."""
    pol = policy(tiny, loaded)
    pol.reset_rng(0)
    probs = torch.tensor([0.4, 0.3, 0.2, 0.06, 0.04])
    logits = probs.log().repeat(20000, 1) * 0.5  # at temperature 0.5: the same distribution
    with torch.inference_mode():
        ids, lps = pol._sample(logits, SamplingParams(temperature=0.5, top_p=top_p))
    counts = torch.bincount(ids, minlength=5).float() / len(ids)
    want = torch.zeros(5)
    want[:kept] = probs[:kept] / probs[:kept].sum()
    assert torch.allclose(counts, want, atol=0.015), counts
    assert torch.allclose(lps, probs.log()[ids], atol=1e-5)


def test_grouped_query_attention_model(tiny, loaded):
    """A model with fewer key/value heads than query heads (as SmolLM2, Llama 3, Qwen): same replies as the
    uncached path, logprobs of the forward pass, over several turns."""
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = loaded[1]
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=160, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                         pad_token_id=tokenizer.pad_token_id, eos_token_id=loaded[0].config.eos_token_id)
    model = LlamaForCausalLM(config).eval()
    cached = HFPolicy(tiny, model=model, tokenizer=tokenizer)
    plain = HFPolicy(tiny, model=model, tokenizer=tokenizer, prefix_cache=False)
    assert cached.cache_off is None
    gen = torch.Generator().manual_seed(11)
    contexts = {f"k{i}": rand_ids(gen, 9 + 14 * i) for i in range(4)}

    def check(turn, reqs, outs):
        for req, a, b in zip(reqs, *outs, strict=True):
            assert a.token_ids == b.token_ids
            assert a.logprobs == pytest.approx(forward_logprobs(model, req.prompt_ids, a.token_ids, 0), abs=1e-4)

    play([cached, plain], contexts, SamplingParams(temperature=0, max_new_tokens=7), 3, gen, check)
    assert cached._store.heads == 2
