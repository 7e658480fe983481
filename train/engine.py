"""DeepSpeed engines for the actor, the critic and the frozen reference model: `build_engines` makes the
`Engines` an update trains with (in the process group of train/distributed.py), and `optimizer_step` steps
one. The forward passes are in train/forward.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from trajlake.lm.load import load_model, load_tokenizer
from trajlake.train.config import TrainConfig
from trajlake.train.distributed import device, init_distributed

#: device types whose torch AdamW has a fused kernel
FUSED_ADAM_DEVICES = ("cpu", "cuda")


def ds_config(cfg: TrainConfig, world: int, *, lr: float | None = None, optimizer: bool = True) -> dict:
    """The DeepSpeed config dict a TrainConfig stands for."""
    accum = cfg.accum_steps(world)
    zero: dict[str, Any] = {"stage": cfg.engine.zero_stage}
    if cfg.engine.zero_stage == 3:
        zero["stage3_gather_16bit_weights_on_model_save"] = True
    conf: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": cfg.optim.micro_batch,
        "gradient_accumulation_steps": accum,
        "train_batch_size": cfg.optim.micro_batch * accum * world,
        "gradient_clipping": cfg.optim.grad_clip,
        "zero_optimization": zero,
        "bf16": {"enabled": cfg.engine.dtype == "bf16"},
        "steps_per_print": 2**31 - 1,
        "wall_clock_breakdown": False,
    }
    if optimizer:
        # torch_adam: torch's AdamW, nothing to compile (DeepSpeed's fused CPU Adam builds a C++ op first); its
        # fused kernel where torch has one: one pass over each tensor instead of one per operation (a third of
        # the step's time on a CPU), the same update to float rounding
        params = {"lr": cfg.optim.lr if lr is None else lr, "betas": [0.9, 0.999], "eps": 1e-8,
                  "weight_decay": cfg.optim.weight_decay, "torch_adam": True}
        if device().type in FUSED_ADAM_DEVICES:
            params["fused"] = True
        conf["optimizer"] = {"type": "AdamW", "params": params}
        if lr is None and cfg.optim.lr_warmup_steps:  # the actor's lr only (a critic passes its own)
            conf["scheduler"] = {"type": "WarmupLR", "params": {
                # the first step at lr / N (from 0, DeepSpeed's first step would be wasted), lr from step N on
                "warmup_min_lr": cfg.optim.lr / cfg.optim.lr_warmup_steps, "warmup_max_lr": cfg.optim.lr,
                "warmup_num_steps": cfg.optim.lr_warmup_steps, "warmup_type": "linear"}}
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
        backbone = load_model(path, lm_head=False)
        return cls(backbone, backbone.config.hidden_size)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        h = self.backbone(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).last_hidden_state
        v = self.value_head(h.to(self.value_head.weight.dtype)).squeeze(-1).float()
        return F.pad(v[:, :-1], (1, 0))


#: the smallest tied embedding matrix whose gradient rows are taken sparse (`sparse_tied_embedding`): 32 MiB, the
#: size above which glibc maps fresh pages for every new matrix (its largest mmap threshold), so each dense pass
#: over it faults its pages in again
SPARSE_EMBEDDING_MIN_BYTES = 32 * 2**20


def sparse_tied_embedding(model: nn.Module, zero_stage: int, *, min_bytes: int = SPARSE_EMBEDDING_MIN_BYTES) -> bool:
    """Let a model whose input embedding is its output projection (tied weights, as SmolLM2's) take the
    embedding's share of the shared weight's gradient as sparse rows, which the output projection's dense share
    absorbs in place; returns whether it did. Dense, the embedding's backward fills a zero (vocab, hidden)
    tensor and then adds it to the projection's, two passes over fresh memory per micro-batch: on SmolLM2-135M
    (113 MB) a tenth of its update. The weight's gradient is dense either way (the two shares are summed before it
    is accumulated), equal up to the order its rows' terms are summed in. Left dense: a matrix under `min_bytes`
    (its passes cost nothing measurable, and a run's rounding stays as it was), an untied embedding (its gradient
    alone would reach the optimizer sparse) and ZeRO-3, whose partitioned parameters DeepSpeed gathers and reduces
    itself."""
    emb, out = model.get_input_embeddings(), model.get_output_embeddings()
    if (zero_stage == 3 or not isinstance(emb, nn.Embedding) or out is None or out.weight is not emb.weight
            or emb.max_norm is not None or not emb.weight.requires_grad
            or emb.weight.nbytes < min_bytes):
        return False
    emb.sparse = True
    return True


def make_engine(model: nn.Module, cfg: TrainConfig, world: int, *, lr: float | None = None):
    import deepspeed

    if hasattr(model, "get_output_embeddings"):  # a causal LM (the actor); a ValueModel has no projection
        sparse_tied_embedding(model, cfg.engine.zero_stage)
    params = [p for p in model.parameters() if p.requires_grad]
    engine, *_ = deepspeed.initialize(model=model, model_parameters=params, config=ds_config(cfg, world, lr=lr))
    if world == 1 and cfg.engine.zero_stage == 0:
        # one process, no ZeRO optimizer to hand the gradients to: DeepSpeed's all-reduce would flatten every
        # gradient into one buffer, scale it by 1 and copy it back at each optimizer step (on SmolLM2-135M,
        # two copies of 540 MB per step), and leave them as they were
        engine.enable_backward_allreduce = False
    return engine


def make_frozen(model: nn.Module, cfg: TrainConfig, world: int):
    """A frozen model (the KL reference): a DeepSpeed inference engine under ZeRO-3 (partitioned like the
    actor), else the module itself in eval mode in the training dtype."""
    model.requires_grad_(False)
    model.eval()
    if cfg.engine.zero_stage == 3:
        import deepspeed

        engine, *_ = deepspeed.initialize(model=model, config=ds_config(cfg, world, optimizer=False))
        return engine
    return model.to(device(), dtype=torch.bfloat16 if cfg.engine.dtype == "bf16" else torch.float32)


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
    torch.manual_seed(cfg.run.seed)
    tokenizer = load_tokenizer(model_path)
    engines = Engines(make_engine(load_model(model_path), cfg, world), tokenizer, rank=rank, world=world)
    if critic:
        engines.critic = make_engine(ValueModel.from_pretrained(critic_path or model_path), cfg, world,
                                     lr=cfg.critic.lr)
    if ref:
        engines.ref = make_frozen(load_model(ref_path or model_path), cfg, world)
    return engines


def optimizer_step(engine) -> float | None:
    """engine.step() at a gradient-accumulation boundary; returns the gradient norm before clipping, None where
    DeepSpeed did not compute one (not a NaN: train/finite.py stops a run on a NaN norm)."""
    norm = None
    if engine.zero_optimization_stage() == 0 and not engine.bfloat16_enabled():
        grads = [p.grad for p in engine.module.parameters() if p.grad is not None]
        norm = float(torch.nn.utils.get_total_norm(grads)) if grads else 0.0
    try:
        engine.step()
    except RuntimeError as e:  # torch's optimizer refuses a step whose scalars overflow float32: not a traceback
        if "overflow" not in str(e):
            raise
        from trajlake.train.finite import NonFiniteError

        raise NonFiniteError("update", message=f"the update was not finite ({e})") from None
    if norm is None:
        g = engine.get_global_grad_norm()
        norm = float(g) if g is not None else None
    return norm
