"""DeepSpeed engines for the actor, the critic and the frozen reference model, and the forward helpers.

One process by default: when the process was not started by a launcher (no RANK in the environment),
`init_distributed` sets up a one-process group on a free localhost port, so the same code runs as one
process, as N processes on one machine (`deepspeed --num_gpus N`, or `torchrun --nproc_per_node N`, which
set RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT) or on many nodes. On CPU (DS_ACCELERATOR=cpu) the backend is
gloo (or oneCCL when installed); on GPUs, NCCL.
"""

from __future__ import annotations

import inspect
import os
import socket
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from trajlake.train.algos import entropy_from_logits, log_probs_from_logits
from trajlake.train.config import TrainConfig

os.environ.setdefault("DS_ACCELERATOR", "cpu" if not torch.cuda.is_available() else "cuda")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init_distributed() -> tuple[int, int]:
    """Join (or make, for a lone process) the process group; returns (rank, world size)."""
    import deepspeed
    import torch.distributed as dist

    if not dist.is_initialized():
        from deepspeed.accelerator import get_accelerator

        backend = get_accelerator().communication_backend_name()
        if "RANK" not in os.environ:  # not started by a launcher: a group of one on a free localhost port
            rendezvous = dict(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()))
            os.environ.update(LOCAL_RANK="0", LOCAL_SIZE="1", **rendezvous)
            try:
                deepspeed.init_distributed(dist_backend=backend, verbose=False)
            finally:  # so that processes this one starts (e.g. a trainer in a test) do not join this group
                for k in rendezvous:
                    os.environ.pop(k, None)
        else:
            deepspeed.init_distributed(dist_backend=backend, verbose=False)
    return dist.get_rank(), dist.get_world_size()


def device() -> torch.device:
    from deepspeed.accelerator import get_accelerator

    return torch.device(get_accelerator().current_device_name())


def is_main() -> bool:
    import torch.distributed as dist

    return not dist.is_initialized() or dist.get_rank() == 0


def barrier() -> None:
    import torch.distributed as dist

    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()


def broadcast(obj: Any) -> Any:
    """Rank 0's `obj` on every rank (pickled)."""
    import torch.distributed as dist

    if not dist.is_initialized() or dist.get_world_size() == 1:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def all_gather(obj: Any) -> list[Any]:
    """Every rank's `obj`, in rank order (pickled)."""
    import torch.distributed as dist

    if not dist.is_initialized() or dist.get_world_size() == 1:
        return [obj]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def all_mean(values: dict[str, float]) -> dict[str, float]:
    """Average a dict of floats over the ranks (same keys on every rank)."""
    import torch.distributed as dist

    if not dist.is_initialized() or dist.get_world_size() == 1 or not values:
        return values
    keys = sorted(values)
    t = torch.tensor([float(values[k]) for k in keys], dtype=torch.float64)
    dist.all_reduce(t)
    return {k: float(v) / dist.get_world_size() for k, v in zip(keys, t.tolist(), strict=True)}


def ds_config(cfg: TrainConfig, world: int, *, lr: float | None = None, optimizer: bool = True) -> dict:
    """The DeepSpeed config dict a TrainConfig stands for."""
    accum = cfg.accum_steps(world)
    zero: dict[str, Any] = {"stage": cfg.zero_stage}
    if cfg.zero_stage == 3:
        zero["stage3_gather_16bit_weights_on_model_save"] = True
    conf: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": cfg.micro_batch,
        "gradient_accumulation_steps": accum,
        "train_batch_size": cfg.micro_batch * accum * world,
        "gradient_clipping": cfg.grad_clip,
        "zero_optimization": zero,
        "bf16": {"enabled": cfg.dtype == "bf16"},
        "steps_per_print": 2**31 - 1,
        "wall_clock_breakdown": False,
    }
    if optimizer:
        # torch_adam: torch's AdamW, nothing to compile (DeepSpeed's fused CPU Adam builds a C++ op first)
        conf["optimizer"] = {"type": "AdamW", "params": {"lr": cfg.lr if lr is None else lr, "betas": [0.9, 0.999],
                                                         "eps": 1e-8, "weight_decay": cfg.weight_decay,
                                                         "torch_adam": True}}
    return conf


class ValueModel(nn.Module):
    """A critic: the causal LM's transformer body and a linear value head, one value per position.

    forward(input_ids, attention_mask) -> (B, T) values aligned as log-probs are: the value at position t
    is the head's output on the hidden state of position t - 1 (the state before token t is chosen);
    position 0 gets 0.
    """

    def __init__(self, backbone: nn.Module, hidden_size: int):
        super().__init__()
        self.backbone = backbone
        self.value_head = nn.Linear(hidden_size, 1)
        nn.init.zeros_(self.value_head.weight)
        nn.init.zeros_(self.value_head.bias)

    @classmethod
    def from_pretrained(cls, path: str) -> ValueModel:
        from transformers import AutoModel

        backbone = AutoModel.from_pretrained(path, local_files_only=True, dtype=torch.float32)
        return cls(backbone, backbone.config.hidden_size)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        h = self.backbone(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).last_hidden_state
        v = self.value_head(h.to(self.value_head.weight.dtype)).squeeze(-1).float()
        return F.pad(v[:, :-1], (1, 0))


def load_actor(path: str):
    """The causal LM (fp32; DeepSpeed casts it for bf16) and its tokenizer, from a local folder."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True, dtype=torch.float32)
    return model, tokenizer


def make_engine(model: nn.Module, cfg: TrainConfig, world: int, *, lr: float | None = None):
    import deepspeed

    params = [p for p in model.parameters() if p.requires_grad]
    engine, *_ = deepspeed.initialize(model=model, model_parameters=params, config=ds_config(cfg, world, lr=lr))
    return engine


def make_frozen(model: nn.Module, cfg: TrainConfig, world: int):
    """A frozen model (the KL reference): a DeepSpeed inference engine under ZeRO-3 (partitioned like the
    actor), else the module itself in eval mode in the training dtype."""
    model.requires_grad_(False)
    model.eval()
    if cfg.zero_stage == 3:
        import deepspeed

        engine, *_ = deepspeed.initialize(model=model, config=ds_config(cfg, world, optimizer=False))
        return engine
    return model.to(device(), dtype=torch.bfloat16 if cfg.dtype == "bf16" else torch.float32)


@dataclass
class Engines:
    """What an update trains with: the actor (always), the critic (ppo) and the reference (KL on)."""

    actor: Any
    tokenizer: Any
    critic: Any = None
    ref: Any = None
    rank: int = 0
    world: int = 1

    @property
    def pad_id(self) -> int:
        t = self.tokenizer
        return t.pad_token_id if t.pad_token_id is not None else (t.eos_token_id or 0)


def build_engines(cfg: TrainConfig, model_path: str, *, critic_path: str | None = None,
                  ref_path: str | None = None, critic: bool = False, ref: bool = False) -> Engines:
    """Actor from `model_path`; critic (a value head on `critic_path` or the actor's body) when `critic`;
    a frozen reference from `ref_path` (default the actor's start) when `ref`."""
    rank, world = init_distributed()
    torch.manual_seed(cfg.seed)
    model, tokenizer = load_actor(model_path)
    engines = Engines(make_engine(model, cfg, world), tokenizer, rank=rank, world=world)
    if critic:
        engines.critic = make_engine(ValueModel.from_pretrained(critic_path or model_path), cfg, world,
                                     lr=cfg.critic_lr)
    if ref:
        engines.ref = make_frozen(load_actor(ref_path or model_path)[0], cfg, world)
    return engines


def accepts_logits_to_keep(model) -> bool:
    """Whether `model` (a module or a DeepSpeed engine around one) takes transformers' `logits_to_keep`."""
    module = getattr(model, "module", model)
    cls = type(module)
    if cls not in _KEEPS_LOGITS:
        try:
            _KEEPS_LOGITS[cls] = "logits_to_keep" in inspect.signature(module.forward).parameters
        except (TypeError, ValueError):
            _KEEPS_LOGITS[cls] = False
    return _KEEPS_LOGITS[cls]


_KEEPS_LOGITS: dict[type, bool] = {}

#: rows share a prefix in a forward pass when it is at least this long (below, the extra pass costs more)
MIN_SHARED_PREFIX = 16


def can_share_prefix(model) -> bool:
    """Whether `forward_logprobs` can read a prefix shared by the rows once for `model`: a causal LM with
    full attention (sdpa or eager) that takes `logits_to_keep`, not partitioned by ZeRO-3."""
    from trajlake.lm.prefix import cache_unsupported

    module = getattr(model, "module", model)
    stage = getattr(model, "zero_optimization_stage", None)
    return ((stage is None or stage() < 3) and accepts_logits_to_keep(model)
            and cache_unsupported(module) is None)


def shared_prefix(input_ids: torch.Tensor, attention_mask: torch.Tensor, limit: int) -> int:
    """Length of the longest prefix of real tokens that every row of a right-padded (B, T) batch starts
    with, at most `limit`."""
    if input_ids.shape[0] < 2 or limit < 1:
        return 0
    n = min(limit, int(attention_mask.sum(-1).min()))
    if n < 1 or not bool(attention_mask[:, :n].all()):
        return 0
    differs = (input_ids[:, :n] != input_ids[:1, :n]).any(0).nonzero()
    return int(differs[0, 0]) if len(differs) else n


@dataclass
class Context:
    """Keys and values (per layer, (1, heads, length, head_dim)) of a prefix that every row of a mini-batch
    starts with (a system prompt), computed once for all its micro-batches (see `prefix_context`). Under
    autograd the micro-batches read detached copies, whose gradients `context_loss` sends back through the
    one prefix pass."""

    length: int
    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    source: list[torch.Tensor] | None = None  # the prefix pass's keys then values, in its graph


def prefix_context(model, ids: torch.Tensor) -> Context:
    """One pass over `ids` (1, L): the Context of that prefix. (The pass runs on the module itself, outside
    a DeepSpeed engine's output hooks: its gradient arrives through `context_loss`.)"""
    model = getattr(model, "module", model)
    ids = ids.to(device())
    out = model(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=True, logits_to_keep=1)
    keys = [layer.keys for layer in out.past_key_values.layers]
    values = [layer.values for layer in out.past_key_values.layers]
    if not torch.is_grad_enabled():
        return Context(ids.shape[1], keys, values)
    return Context(ids.shape[1], [k.detach().requires_grad_() for k in keys],
                   [v.detach().requires_grad_() for v in values], keys + values)


def context_loss(context: Context) -> torch.Tensor | None:
    """A scalar whose gradient is what the micro-batches' losses sent into the context's keys and values,
    carried through the prefix pass (its backward adds the prefix's share of every gradient)."""
    leaves = context.keys + context.values
    terms = [(src * leaf.grad).sum() for src, leaf in zip(context.source or [], leaves, strict=True)
             if leaf.grad is not None]
    return torch.stack(terms).sum() if terms else None


def _context_forward(model, ids: torch.Tensor, attn: torch.Tensor, context: Context, prefix: int,
                     keep: int) -> torch.Tensor:
    """`_shared_forward` starting from a Context: the rows' common prefix from the context's end on is
    read once (one row), the rest of every row attends to both."""
    from transformers import DynamicCache

    b = ids.shape[0]
    cache = DynamicCache(config=getattr(model, "module", model).config)
    for i, (k, v) in enumerate(zip(context.keys, context.values, strict=True)):
        cache.update(k, v, i)
    if prefix > context.length:
        model(input_ids=ids[:1, context.length:prefix], attention_mask=attn[:1, :prefix], past_key_values=cache,
              use_cache=True, logits_to_keep=1)
    for layer in cache.layers:
        layer.keys = layer.keys.expand(b, -1, -1, -1)
        layer.values = layer.values.expand(b, -1, -1, -1)
    return model(input_ids=ids[:, prefix:], attention_mask=attn, past_key_values=cache, use_cache=True,
                 logits_to_keep=keep).logits


def _shared_forward(model, ids: torch.Tensor, attn: torch.Tensor, prefix: int, keep: int) -> torch.Tensor:
    """The logits of the last `keep` positions, reading `prefix` tokens common to every row once: a pass
    over one row's prefix keeps its keys and values (with their gradient), every row's rest attends to
    them. Same logits (and gradients) as one pass over the full rows."""
    b = ids.shape[0]
    out = model(input_ids=ids[:1, :prefix], attention_mask=attn[:1, :prefix], use_cache=True, logits_to_keep=1)
    cache = out.past_key_values
    for layer in cache.layers:  # a view per row: the gradients of the rows add up in the prefix pass
        layer.keys = layer.keys.expand(b, -1, -1, -1)
        layer.values = layer.values.expand(b, -1, -1, -1)
    return model(input_ids=ids[:, prefix:], attention_mask=attn, past_key_values=cache, use_cache=True,
                 logits_to_keep=keep).logits


def forward_logprobs(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, *, temperature: float = 1.0,
                     entropy: bool = False, start: int = 0, share_prefix: bool = False,
                     context: Context | None = None,
                     entropy_grad: bool = True) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs of each token given the ones before it, (B, T), 0 at position 0 (no token before it); with
    `entropy`, the entropy of the distribution each token was drawn from, (B, T). Logits are divided by the
    sampling `temperature`, as the sampler did.

    `start` > 0: only the tokens after position `start` are scored (the caller masks the others, e.g. the
    first prompt), so a model that takes `logits_to_keep` computes logits from position `start` on only;
    the log-probs and entropies of positions 0..start are then 0. `share_prefix` (with `start`): a prefix
    of up to `start` tokens that every row starts with (a GRPO group's prompt) is read once for all rows,
    when `can_share_prefix(model)`; `context`: the Context of a prefix every row starts with (of at most
    `start` tokens), from which that pass starts. `entropy_grad` False: the entropy is a metric only."""
    dev = device()
    ids, attn = input_ids.to(dev), attention_mask.to(dev)
    T = ids.shape[1]
    start = start if 0 < start < T - 1 and accepts_logits_to_keep(model) else 0
    prefix = shared_prefix(ids, attn, start) if share_prefix and start else 0
    if context is not None and ids.shape[0] == 1:  # a lone row shares everything with itself
        prefix = start
    if context is not None and start and prefix >= context.length:
        logits = _context_forward(model, ids, attn, context, prefix, T - start)[:, -(T - start):-1]
    elif prefix >= MIN_SHARED_PREFIX and can_share_prefix(model):
        logits = _shared_forward(model, ids, attn, prefix, T - start)[:, -(T - start):-1]
    elif start:
        logits = model(input_ids=ids, attention_mask=attn, use_cache=False, logits_to_keep=T - start).logits
        logits = logits[:, -(T - start):-1]
    else:
        logits = model(input_ids=ids, attention_mask=attn, use_cache=False).logits[:, :-1]
    if temperature != 1.0:
        logits = logits / temperature
    lp = F.pad(log_probs_from_logits(logits, ids[:, start + 1:]), (start + 1, 0))
    ent = None
    if entropy:
        with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
            ent = F.pad(entropy_from_logits(logits), (start + 1, 0))
    return lp, ent


def first_scored(loss_mask: torch.Tensor) -> int:
    """The `start` of forward_logprobs for a (B, T) loss mask: the position before its first scored token
    (0: score every token)."""
    cols = (loss_mask > 0).any(0).nonzero()
    return max(int(cols[0, 0]) - 1, 0) if len(cols) else 0


def forward_values(critic, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """The critic's values, (B, T), aligned with the log-probs (see ValueModel)."""
    dev = device()
    return critic(input_ids=input_ids.to(dev), attention_mask=attention_mask.to(dev))


def optimizer_step(engine) -> float:
    """engine.step() at a gradient-accumulation boundary; returns the gradient norm before clipping."""
    norm = None
    if engine.zero_optimization_stage() == 0 and not engine.bfloat16_enabled():
        grads = [p.grad for p in engine.module.parameters() if p.grad is not None]
        norm = float(torch.nn.utils.get_total_norm(grads)) if grads else 0.0
    engine.step()
    if norm is None:
        g = engine.get_global_grad_norm()
        norm = float(g) if g is not None else float("nan")
    return norm


def set_lr(engine, lr: float) -> None:
    for group in engine.optimizer.param_groups:
        group["lr"] = lr
