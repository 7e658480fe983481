"""Transformers policy: batched sampling on CPU (the default backend) or GPU, returning exact ids.

All live episodes' requests are answered together, up to `max_batch` rows at a time. Logprobs are those of
the distribution sampled from: log_softmax(logits / temperature) at the sampled id, before top-p truncation
(as verl computes them), and of the raw logits when greedy.

Prefix caching. A multi-turn episode sends its whole context every turn, and re-reading it is most of the
work. So the policy keeps each episode's attention keys and values (its KV cache) between turns, keyed by
`request.key` (the episode id), and a turn feeds the model only the tokens the cache does not cover: the
new prompt (and the previous reply's last token). The cache is checked against the request: it is used
for the longest common prefix of the ids it covers and `request.prompt_ids` (a context that was rewritten
is re-read from where it differs; the rest of the cache is dropped), so the result never depends on it.

The KV caches live in one preallocated buffer per layer (kv_slots.py), of shape (slots, kv_heads, width,
head_dim): each cached episode owns a slot (a row) and its keys and values sit at columns 0..len-1, i.e.
column = position. A turn's rows are a contiguous range of slots, so the model reads them as a view (no
copying); the new prompt tokens (left-padded to a common length, so every row's last prompt token is the last
column) are written at their own positions, pads after the row's end where decoding later overwrites them;
each decode step writes one column per row (no reallocation, no concatenation). The attention mask is explicit
(4D: key column <= the query's position) and so are the position ids (each row's own), so every row computes
what an unpadded forward pass over its full sequence computes.

Prefixes shared by episodes are read once: new episodes of one batch whose prompts start the same way (the
system prompt; all samples of a task) get the common part computed for one of them and copied, and a new
episode can start from what an ended episode left in its freed slot.

Memory: the buffer grows as needed (geometrically); it holds the batch's rows plus, up to
`max_cache_bytes`, other episodes' slots (least recently used ones are evicted first). `end_episode(key)`
frees the episode's slot for the next one; `clear_cache()` (and `close()`) release the buffer.

Models whose attention this cannot drive (sliding windows, linear attention, attention kernels other than
sdpa/eager) and `prefix_cache=False` use `model.generate` on the left-padded full contexts instead.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import torch

from trajlake.collect.policies.base import Generation, Policy, Request, SamplingParams
from trajlake.collect.policies.kv_slots import KVStore, make_cache_classes
from trajlake.core.errors import TrajlakeError
from trajlake.lm.load import load_model, load_tokenizer
from trajlake.lm.prefix import MIN_SHARED_PREFIX, cache_kwargs, cache_unsupported, common_prefix

#: default bound of the memory kept for cached episodes that are not being answered (the rows of a batch
#: always fit, whatever this says)
DEFAULT_CACHE_BYTES = 2 << 30


def stop_ids(tokenizer, eos: int | list[int] | None) -> list[int]:
    """Token ids that end a reply: the tokenizer's eos, the chat template's end-of-turn tokens and the model's
    generation config's `eos` (an id, a list, or None)."""
    ids = set()
    for tok in (tokenizer.eos_token, "<|im_end|>", "<|eot_id|>", "<end_of_turn>", "<|end|>"):
        if tok and tok in tokenizer.get_vocab():
            ids.add(tokenizer.convert_tokens_to_ids(tok))
    ids.update(eos if isinstance(eos, list) else [eos] if eos is not None else [])
    return sorted(ids)


class HFPolicy(Policy):
    """A local transformers checkpoint sampling batched replies, with per-episode prefix caching."""

    exact_tokens = True

    def __init__(self, path: str | Path, *, policy_id: str | None = None, device: str = "cpu",
                 max_batch: int = 64, model=None, tokenizer=None, prefix_cache: bool = True,
                 max_cache_bytes: int = DEFAULT_CACHE_BYTES):
        self.model_path = str(Path(path).absolute())
        if model is None:
            model, tokenizer = load_model(path, device=device), load_tokenizer(path)
        self.model, self.tokenizer = model, tokenizer
        self.device = device
        self.max_batch = max_batch
        self.policy_id = policy_id or f"hf:{self.model_path}"
        self.stop = stop_ids(tokenizer, model.generation_config.eos_token_id)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.stop[0]
        #: why the cached decoder is not used (None: it is)
        self.cache_off: str | None = None if prefix_cache else "prefix_cache=False"
        if self.cache_off is None:
            self.cache_off = cache_unsupported(model)
        self.max_cache_bytes = max_cache_bytes
        self._store: KVStore | None = None
        self._cache_cls = None
        self._rng: torch.Generator | None = None
        self._global_seed: int | None = None  # model.generate (the uncached path) samples from torch's RNG
        self._seeded = False
        self._anon = itertools.count()

    # ---- the sampler's seed ---------------------------------------------------------------------
    def reset_rng(self, seed: int) -> None:
        """Seed the sampler (the rollout calls this at the start of a run; otherwise the first `generate`
        seeds it from `params.seed`)."""
        self._rng = torch.Generator(device=self.device)
        self._rng.manual_seed(seed)
        self._global_seed = seed
        self._seeded = True

    # ---- episodes -------------------------------------------------------------------------------
    def end_episode(self, key: str) -> None:
        if self._store is not None:
            self._store.drop(key)

    def cached_ids(self, key: str) -> list[int] | None:
        """The ids whose keys and values are cached for `key` (None: nothing cached)."""
        if self._store is None or key not in self._store.where:
            return None
        return list(self._store.slots[self._store.where[key]].ids)

    @property
    def cache_bytes(self) -> int:
        """Bytes held by the KV buffer."""
        return 0 if self._store is None else self._store.nbytes

    def clear_cache(self) -> None:
        """Drop every cached episode and the buffer (the cache assumes fixed weights: clear it after changing
        them)."""
        if self._store is not None:
            self._store.clear()

    # ---- generation -----------------------------------------------------------------------------
    @torch.inference_mode()
    def generate(self, requests: list[Request], params: SamplingParams) -> list[Generation]:
        if not self._seeded:
            self.reset_rng(params.seed)
        out: list[Generation] = []
        for start in range(0, len(requests), self.max_batch):
            chunk = requests[start:start + self.max_batch]
            if self.cache_off is None and self._kv_store() is not None:
                out.extend(self._generate_cached(chunk, params))
            else:
                out.extend(self._generate_batch([r.prompt_ids for r in chunk], params))
        return out

    def _generate_batch(self, prompts: list[list[int]], params: SamplingParams) -> list[Generation]:
        """The uncached path: `model.generate` on the left-padded full contexts."""
        if self._global_seed is not None:
            torch.manual_seed(self._global_seed)
            self._global_seed = None
        width = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for i, p in enumerate(prompts):  # left padding: every row's reply starts at column `width`
            ids[i, width - len(p):] = torch.tensor(p, dtype=torch.long)
            mask[i, width - len(p):] = 1
        sample = not params.greedy
        result = self.model.generate(
            input_ids=ids.to(self.device), attention_mask=mask.to(self.device),
            do_sample=sample, temperature=params.temperature if sample else None,
            top_p=params.top_p if sample else None, top_k=0 if sample else None,
            max_new_tokens=params.max_new_tokens, eos_token_id=self.stop, pad_token_id=self.pad_id,
            output_logits=True, return_dict_in_generate=True,
        )
        new = result.sequences[:, width:].cpu()
        logits = torch.stack(result.logits, dim=1).float().cpu()  # (B, T, V), raw
        if sample:
            logits = logits / params.temperature
        logprobs = torch.log_softmax(logits, dim=-1).gather(-1, new[:, : logits.shape[1], None]).squeeze(-1)
        return self._generations(new, logprobs)

    def _generations(self, new: torch.Tensor, logprobs: torch.Tensor) -> list[Generation]:
        gens = []
        stop = set(self.stop)
        for tokens, lps in zip(new.tolist(), logprobs.tolist(), strict=True):
            end = next((i + 1 for i, t in enumerate(tokens) if t in stop), None)
            finish = "stop" if end is not None else "length"
            end = end or len(tokens)
            gens.append(Generation(tokens[:end], lps[:end], finish_reason=finish))
        return gens

    # ---- the prefix-cached decoder ---------------------------------------------------------------------
    def _kv_store(self) -> KVStore | None:
        """The slot buffer, shaped after what the model's attention layers store (found with one token);
        None (and `cache_off` says why) when the layers do not all store the same shapes."""
        if self._store is None:
            from transformers import DynamicCache

            probe = DynamicCache(config=self.model.config)
            self.model(input_ids=torch.tensor([[self.pad_id]], device=self.device),
                       **cache_kwargs(self.model, probe), use_cache=True)
            shapes = {(tuple(lay.keys.shape), tuple(lay.values.shape), lay.keys.dtype) for lay in probe.layers}
            (kshape, vshape, dtype), = shapes if len(shapes) == 1 else ((None, None, None),)
            if kshape is None or kshape != vshape or len(kshape) != 4 or kshape[2] != 1:
                self.cache_off = f"KV cache layers of unexpected shapes {sorted(map(str, shapes))}"
                return None
            self._store = KVStore(len(probe.layers), kshape[1], kshape[3], dtype, self.device,
                                   self.max_cache_bytes)
            self._cache_cls = make_cache_classes()
        return self._store

    def _mask(self, cols: torch.Tensor, span: int) -> torch.Tensor:
        """(B, 1, q, span): key column k is seen by the query at column c iff k <= c."""
        allowed = torch.arange(span, device=self.device)[None, None, None, :] <= cols[:, None, :, None]
        zero = torch.zeros((), dtype=self._store.dtype, device=self.device)
        return torch.where(allowed, zero, torch.finfo(self._store.dtype).min)

    def _forward(self, cache, ids: torch.Tensor, cols: torch.Tensor, span: int) -> torch.Tensor:
        """Feed `ids` (B, q) at columns (= positions) `cols`, attending to columns 0..span-1 (span: the
        largest column + 1); the last input's logits (B, V)."""
        cache.cols, cache.span = cols, span
        out = self.model(input_ids=ids, attention_mask=self._mask(cols, span), position_ids=cols,
                         **cache_kwargs(self.model, cache), use_cache=True, logits_to_keep=1)
        return out.logits[:, -1, :]

    def _generate_cached(self, requests: list[Request], params: SamplingParams) -> list[Generation]:
        store = self._store
        keys = self._row_keys(requests)
        prompts = [list(r.prompt_ids) for r in requests]
        if any(not p for p in prompts):
            raise TrajlakeError("a request has no prompt ids")
        have = self._keep_cached(keys, prompts)
        reuse, shared = self._shared_prefixes(prompts, have)
        new = [len(p) - r for p, r in zip(prompts, reuse, strict=True)]
        width, steps = max(new), params.max_new_tokens
        lo = store.place(keys, max(r + max(width, n + steps - 1) for r, n in zip(reuse, new, strict=True)))
        rows = [store.where[key] - lo for key in keys]  # request i is row rows[i] of the batch
        for leader, members, length in shared:  # a prefix common to several rows is read once
            src = lo + rows[leader]
            if have[leader] < length:
                self._prefill_one(src, prompts[leader], have[leader], length)
            for i in members:
                store.copy(src, lo + rows[i], have[i], length)
                store.slots[lo + rows[i]].ids = prompts[i][:length]
        cache = self._cache_cls(store.keys[:, lo:lo + len(keys)], store.values[:, lo:lo + len(keys)])
        logits, last_cols = self._prefill_rows(cache, rows, prompts, reuse, new)
        span = max(len(p) for p in prompts)  # the last fed column + 1
        tokens, logprobs = self._decode(cache, logits, last_cols, span, params)
        by_row = self._generations(tokens.cpu(), logprobs.cpu())
        gens = [by_row[row] for row in rows]
        for key, row, p, g in zip(keys, rows, prompts, gens, strict=True):
            # the slot now covers the prompt and the reply but its last token (never fed)
            store.slots[lo + row].ids = p + g.token_ids[:-1]
            if isinstance(key, tuple):
                store.drop(key)
        return gens

    def _row_keys(self, requests: list[Request]) -> list:
        """One slot key per row: a key asked twice in the batch gets a throwaway key (a tuple) the second time."""
        keys, seen = [], set()
        for r in requests:
            key = r.key if r.key not in seen else ("anon", next(self._anon))
            seen.add(key)
            keys.append(key)
        return keys

    def _keep_cached(self, keys: list, prompts: list[list[int]]) -> list[int]:
        """How many columns of each row's slot are kept: the longest common prefix of what it caches (or a free
        slot it claims) and its prompt, but at least one prompt token is always fed (its logits start the
        reply). The slots forget their columns beyond that."""
        store, have = self._store, []
        for key, p in zip(keys, prompts, strict=True):
            s = store.where.get(key)
            n = common_prefix((store.slots[s].ids, p)) if s is not None else store.claim(key, p)
            have.append(min(n, len(p) - 1))
            if key in store.where:
                store.slots[store.where[key]].ids[have[-1]:] = []
        return have

    def _prefill_rows(self, cache, rows: list[int], prompts: list[list[int]], reuse: list[int],
                      new: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """Feed every row's uncached prompt tokens in one forward, left-padded: token j of a row goes to column
        reuse + j and the pads after the row's last token (decoding overwrites them), so every row's last
        prompt token is the last input. Returns the last logits (B, V) and each row's last fed column (B,)."""
        b, width = len(rows), max(new)
        ids = torch.full((b, width), self.pad_id, dtype=torch.long)
        cols = torch.empty((b, width), dtype=torch.long)
        ar = torch.arange(width)
        for row, p, r, n in zip(rows, prompts, reuse, new, strict=True):
            ids[row, width - n:] = torch.tensor(p[r:], dtype=torch.long)
            cols[row] = r + (ar - (width - n)) % width
        ids, cols = ids.to(self.device), cols.to(self.device)
        logits = self._forward(cache, ids, cols, max(r + width for r in reuse))
        return logits, cols[:, -1]

    def _decode(self, cache, logits: torch.Tensor, pos: torch.Tensor, span: int,
                params: SamplingParams) -> tuple[torch.Tensor, torch.Tensor]:
        """Sample up to max_new_tokens for every row from the prefill's last `logits` (B, V), each row's last fed
        column `pos` (B,), feeding each sampled token back, until every row has said a stop token; (tokens,
        their log-probs), both (B, steps taken)."""
        b, steps = logits.shape[0], params.max_new_tokens
        stop = torch.tensor(self.stop, dtype=torch.long, device=self.device)
        tokens = torch.empty((b, steps), dtype=torch.long, device=self.device)
        logprobs = torch.empty((b, steps), dtype=torch.float32, device=self.device)
        done = torch.zeros(b, dtype=torch.bool, device=self.device)
        taken = steps
        for step in range(steps):
            nxt, lp = self._sample(logits.float(), params)
            tokens[:, step], logprobs[:, step] = nxt, lp
            done |= torch.isin(nxt, stop)
            if step == steps - 1 or bool(done.all()):
                taken = step + 1
                break
            pos, span = pos + 1, span + 1
            logits = self._forward(cache, nxt[:, None], pos[:, None], span)
        return tokens[:, :taken], logprobs[:, :taken]

    #: rows share a prefix when that saves reading at least this many tokens
    min_shared = MIN_SHARED_PREFIX

    def _shared_prefixes(self, prompts: list[list[int]], have: list[int]):
        """Rows whose prompts start the same way beyond what some of them cache (a system prompt shared by
        new episodes, a task's first prompt shared by its samples): the common prefix is read once, by the
        row caching most of it, and copied to the others. Returns each row's cached length once that is
        done and the groups as (leader, rows to copy to, prefix length)."""

        def saved(group: list[int], n: int) -> int:
            return sum(max(0, n - have[i]) for i in group) - max(0, n - max(have[i] for i in group))

        reuse = list(have)
        order = sorted(range(len(prompts)), key=lambda i: prompts[i])
        shared = []
        start = 0
        while start < len(order):  # sorted: a run's common prefix is the least of its neighbours' ones
            end, length, best = start + 1, 0, 0
            while end < len(order):
                n = common_prefix((prompts[order[end - 1]], prompts[order[end]]))
                n = min(n if end == start + 1 else min(length, n), len(prompts[order[end]]) - 1,
                        min(len(prompts[i]) - 1 for i in order[start:end]))
                gain = saved(order[start:end + 1], n)
                if gain < max(best, self.min_shared):
                    break
                length, best, end = n, gain, end + 1
            group = order[start:end]
            if len(group) > 1:
                leader = max(group, key=lambda i: have[i])
                shared.append((leader, [i for i in group if have[i] < length and i != leader], length))
                for i in group:
                    reuse[i] = max(have[i], length)
            start = end
        return reuse, shared

    def _prefill_one(self, slot: int, prompt: list[int], start: int, stop: int) -> None:
        """Feed prompt[start:stop] to one slot (its columns start..stop-1)."""
        store = self._store
        cache = self._cache_cls(store.keys[:, slot:slot + 1], store.values[:, slot:slot + 1])
        ids = torch.tensor([prompt[start:stop]], dtype=torch.long, device=self.device)
        self._forward(cache, ids, torch.arange(start, stop, device=self.device)[None], stop)
        store.slots[slot].ids = prompt[:stop]

    def _sample(self, logits: torch.Tensor, params: SamplingParams) -> tuple[torch.Tensor, torch.Tensor]:
        """Next ids (B,) and their logprobs under the distribution sampled from (before top-p)."""
        if params.greedy:
            nxt = logits.argmax(dim=-1)
            return nxt, torch.log_softmax(logits, dim=-1).gather(-1, nxt[:, None])[:, 0]
        logp = torch.log_softmax(logits / params.temperature, dim=-1)
        weights = logp.exp()
        if params.top_p < 1.0:  # as transformers' TopPLogitsWarper: drop the least likely ids holding at most
            # 1 - top_p of the mass (always keeping the most likely): keep the ids at least as likely as the
            # least likely one kept (ties at that threshold are all kept)
            if weights.device.type == "cpu":  # numpy sorts values far faster than torch on CPU
                ascending = torch.from_numpy(np.sort(weights.numpy(), axis=-1))
            else:
                ascending = torch.sort(weights, dim=-1).values
            cut = (ascending.cumsum(dim=-1) <= 1 - params.top_p).sum(dim=-1, keepdim=True)
            least = ascending.gather(-1, cut.clamp(max=weights.shape[-1] - 1))
            weights = weights.masked_fill(weights < least, 0.0)
        # inverse-CDF sampling: one uniform draw per row (torch.multinomial draws one per vocabulary entry)
        cdf = weights.double().cumsum(dim=-1)
        total = cdf[:, -1:]
        u = torch.rand(total.shape, generator=self._rng, dtype=torch.float64, device=total.device) * total
        u = torch.minimum(u, total * (1 - 1e-12))  # strictly below the total: never past the last allowed id
        nxt = torch.searchsorted(cdf, u, right=True)[:, 0]
        return nxt, logp.gather(-1, nxt[:, None])[:, 0]

    def close(self) -> None:
        self.clear_cache()
        self.model = None
