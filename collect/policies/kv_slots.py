"""The prefix cache's storage: one preallocated KV buffer per layer, a slot (row) per cached episode.

Keys and values have shape (layers, slots, kv_heads, width, head_dim); an episode's keys and values sit in
its slot at columns 0..len-1 (column = position). `HFPolicy` (hf.py) places a turn's rows in a contiguous
range of slots and drives the model through `SlotCache`, a transformers `Cache` that writes each forward's
keys and values at their columns and hands the attention the rows' views (no copy, no concatenation).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import torch

from trajlake.lm.prefix import common_prefix


@dataclass
class _Slot:
    """A slot's contents: the ids its keys and values cover (columns 0..len(ids)-1). `key` is the episode
    that owns it; None for a free slot, whose ids (what its last owner left) can still seed a new episode
    whose prompt starts the same way."""

    key: object
    ids: list[int] = field(default_factory=list)
    used: int = 0  # recency, for LRU eviction


class KVStore:
    """The slot buffer: keys and values of shape (layers, slots, kv_heads, width, head_dim)."""

    def __init__(self, layers: int, heads: int, head_dim: int, dtype: torch.dtype, device, max_bytes: int):
        self.layers, self.heads, self.head_dim, self.dtype, self.device = layers, heads, head_dim, dtype, device
        self.max_bytes = max_bytes
        self.col_bytes = 2 * layers * heads * head_dim * torch.empty((), dtype=dtype).element_size()
        self.keys = self.values = None
        self.slots: list[_Slot | None] = []
        self.where: dict[object, int] = {}  # owner key -> slot index
        self.clock = itertools.count(1)

    @property
    def width(self) -> int:
        return 0 if self.keys is None else self.keys.shape[3]

    @property
    def nbytes(self) -> int:
        return 0 if self.keys is None else len(self.slots) * self.width * self.col_bytes

    def free(self, s: int) -> bool:
        return self.slots[s] is None or self.slots[s].key is None

    def drop(self, key) -> None:
        """Forget `key`; its slot becomes free (its data stays until reused, see `claim`)."""
        s = self.where.pop(key, None)
        if s is not None:
            self.slots[s].key = None

    def clear(self) -> None:
        self.keys = self.values = None
        self.slots, self.where = [], {}

    def claim(self, key, prompt: list[int]) -> int:
        """Give the key without a slot the free slot whose leftover ids share the longest prefix with
        `prompt` (a system prompt, say); returns that prefix's length (0: nothing claimed)."""
        best, where = 0, None
        for s, slot in enumerate(self.slots):
            if slot is not None and slot.key is None and slot.ids:
                n = common_prefix((slot.ids, prompt))
                if n > best:
                    best, where = n, s
        if where is not None:
            slot = self.slots[where]
            slot.key, slot.ids = key, slot.ids[:best]
            self.where[key] = where
        return best

    def copy(self, src: int, dst: int, start: int, stop: int) -> None:
        """Copy columns start..stop-1 of slot `src` to slot `dst`."""
        if stop > start:
            self.keys[:, dst, :, start:stop] = self.keys[:, src, :, start:stop]
            self.values[:, dst, :, start:stop] = self.values[:, src, :, start:stop]

    def _move(self, src: int, dst: int) -> None:
        """Move a slot's owner and data to the free slot `dst`."""
        slot = self.slots[src]
        self.copy(src, dst, 0, len(slot.ids))
        self.slots[dst], self.slots[src] = slot, None
        self.where[slot.key] = dst

    def place(self, keys: list[object], need_width: int) -> int:
        """Give the (distinct) `keys` the slots lo..lo+len(keys)-1, in any order, keeping what each has
        cached (a key without a slot gets an empty one), with at least `need_width` columns. Returns lo.
        The buffer holds at most max(len(keys), max_bytes // bytes per slot) slots: other keys that do not
        fit are evicted, least recently used first."""
        self._reserve(keys, need_width)
        mine = set(keys)
        lo = self._best_window(mine, len(keys))
        window = range(lo, lo + len(keys))
        self._clear_window(window, mine)
        free = [s for s in window if self.free(s)]
        for key in keys:
            have = self.where.get(key)
            if have is None:
                s = free.pop()
                self.slots[s] = _Slot(key)
                self.where[key] = s
            elif have not in window:
                self._move(have, free.pop())
        tick = next(self.clock)
        for s in window:
            self.slots[s].used = tick
        return lo

    def _reserve(self, keys: list[object], need_width: int) -> None:
        """Reallocate when the buffer is narrower than `need_width` or has fewer slots than the batch and the
        other keys want (within max_bytes)."""
        mine = set(keys)
        others = sum(1 for k in self.where if k not in mine)
        width = self.width
        if need_width > width:  # grow geometrically: contexts grow every turn
            width = -(-max(need_width, 2 * width) // 64) * 64
        want = min(len(keys) + others, max(len(keys), self.max_bytes // (width * self.col_bytes)))
        if self.keys is None or width > self.width or len(self.slots) < want:
            self._realloc(keys, want, width)

    def _best_window(self, mine: set, b: int) -> int:
        """The start of the `b` contiguous slots that copy the fewest columns: the batch's cached columns
        already in it count for it, other keys' ones (to move out) against it (ties: the lowest start)."""
        kept = [0 if s is None or s.key is None else len(s.ids) + 1 if s.key in mine else -len(s.ids) - 1
                for s in self.slots]
        run = best = sum(kept[:b])
        lo = 0
        for start in range(1, len(self.slots) - b + 1):
            run += kept[start + b - 1] - kept[start - 1]
            if run > best:
                best, lo = run, start
        return lo

    def _clear_window(self, window: range, mine: set) -> None:
        """Move other keys out of `window` to free slots outside it; with no room outside, the least recently
        used of them and the outside keys is evicted."""
        n = len(self.slots)
        outside_free = [t for t in range(n) if t not in window and self.free(t)]
        for s in window:
            slot = self.slots[s]
            if slot is None or slot.key is None or slot.key in mine:
                continue
            if not outside_free:
                victim = min((t for t in range(n) if t not in window and not self.free(t)),
                             key=lambda t: self.slots[t].used, default=s)
                victim = victim if self.slots[victim].used < slot.used else s
                self.drop(self.slots[victim].key)
                if victim == s:
                    continue
                outside_free.append(victim)
            self._move(s, outside_free.pop())

    def _realloc(self, keys: list[object], n_slots: int, width: int) -> None:
        """A new buffer of `n_slots` slots of `width` columns: the batch's cached keys first (the batch then
        takes slots 0..len(keys)-1), then the others by recency, as many as fit (the rest are evicted)."""
        mine = set(keys)
        olds = [s for s in self.slots if s is not None and s.key is not None]
        ours = [s for s in olds if s.key in mine]
        rest = sorted((s for s in olds if s.key not in mine), key=lambda s: -s.used)
        layout = ours + [None] * (len(keys) - len(ours)) + rest
        layout = layout[:n_slots] + [None] * (n_slots - len(layout))
        shape = (self.layers, n_slots, self.heads, width, self.head_dim)
        # zeros: columns a row attends to are always written first, but the batch's other rows' unwritten
        # columns are read (and masked) too, and must not hold NaNs
        keys_buf = torch.zeros(shape, dtype=self.dtype, device=self.device)
        values_buf = torch.zeros(shape, dtype=self.dtype, device=self.device)
        where = {}
        for i, slot in enumerate(layout):
            if slot is None:
                continue
            old, n = self.where[slot.key], len(slot.ids)
            if n:
                keys_buf[:, i, :, :n] = self.keys[:, old, :, :n]
                values_buf[:, i, :, :n] = self.values[:, old, :, :n]
            where[slot.key] = i
        self.keys, self.values, self.slots, self.where = keys_buf, values_buf, layout, where


def make_cache_classes():
    """Cache and cache-layer classes that read and write the slot buffer (built lazily: transformers is
    imported only when a model is used)."""
    from transformers.cache_utils import Cache, CacheLayerMixin

    class SlotLayer(CacheLayerMixin):
        is_sliding = False

        def __init__(self, owner, layer: int):
            super().__init__()
            self.owner, self.layer = owner, layer
            self.is_initialized = True

        def lazy_initialization(self, key_states, value_states) -> None:
            """Nothing to allocate: the layer's keys and values live in the owner's preallocated buffer."""

        def update(self, key_states, value_states, *args, **kwargs):
            o = self.owner
            keys, values = o.keys[self.layer], o.values[self.layer]  # (B, H, width, D) views
            if key_states.shape[2] == 1:
                keys[o.rows, :, o.cols[:, 0]] = key_states[:, :, 0]
                values[o.rows, :, o.cols[:, 0]] = value_states[:, :, 0]
            else:
                keys[o.rows[:, None], :, o.cols] = key_states.transpose(1, 2)
                values[o.rows[:, None], :, o.cols] = value_states.transpose(1, 2)
            return keys[:, :, :o.span], values[:, :, :o.span]

        def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
            return self.owner.span, 0

        def get_seq_length(self) -> int:
            return self.owner.span

        def get_max_length(self) -> int:
            return self.owner.keys.shape[3]

    class SlotCache(Cache):
        """The batch's rows of the slot buffer: each forward writes its keys and values at `cols` (B, q) and
        attends to columns 0..span-1 (the 4D mask says which of them each query sees)."""

        def __init__(self, keys, values):
            self.keys, self.values = keys, values  # (layers, B, H, width, D) views
            self.rows = torch.arange(keys.shape[1], device=keys.device)
            self.cols = None
            self.span = 0
            super().__init__(layers=[SlotLayer(self, i) for i in range(keys.shape[0])])

    return SlotCache
