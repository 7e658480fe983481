"""Transformers policy: batched sampling on CPU (the default backend) or GPU, returning exact ids.

All live episodes' contexts go to one `generate` call (left-padded), up to `max_batch` rows at a time.
Logprobs are those of the distribution sampled from: log_softmax(logits / temperature) at the sampled id,
before top-p truncation (as verl computes them), and of the raw logits when greedy.
"""

from __future__ import annotations

from pathlib import Path

import torch

from trajlake.collect.policies.base import Generation, Policy, Request, SamplingParams
from trajlake.store.errors import TrajlakeError


def load_model(path: str | Path, device: str = "cpu", dtype: torch.dtype = torch.float32):
    """Load a local causal LM and its tokenizer; never reaches a hub."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # our own progress bars say what is happening

    path = Path(path)
    if not (path / "config.json").is_file():
        raise TrajlakeError(f"no model at {path}: expected a folder saved with save_pretrained (config.json)")
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True, dtype=dtype).to(device)
    model.eval()
    return model, tokenizer


def stop_ids(tokenizer, model) -> list[int]:
    """Token ids that end a reply: the tokenizer's eos and the chat template's end-of-turn tokens."""
    ids = set()
    for tok in (tokenizer.eos_token, "<|im_end|>", "<|eot_id|>", "<end_of_turn>", "<|end|>"):
        if tok and tok in tokenizer.get_vocab():
            ids.add(tokenizer.convert_tokens_to_ids(tok))
    eos = model.generation_config.eos_token_id
    ids.update(eos if isinstance(eos, list) else [eos] if eos is not None else [])
    return sorted(ids)


class HFPolicy(Policy):
    """A local transformers checkpoint sampling batched replies."""

    exact_tokens = True

    def __init__(self, path: str | Path, *, policy_id: str | None = None, device: str = "cpu",
                 max_batch: int = 64, model=None, tokenizer=None):
        self.model_path = str(Path(path).absolute())
        if model is None:
            model, tokenizer = load_model(path, device)
        self.model, self.tokenizer = model, tokenizer
        self.device = device
        self.max_batch = max_batch
        self.policy_id = policy_id or f"hf:{self.model_path}"
        self.stop = stop_ids(tokenizer, model)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.stop[0]
        self._seeded = False

    @torch.inference_mode()
    def generate(self, requests: list[Request], params: SamplingParams) -> list[Generation]:
        if not self._seeded:
            torch.manual_seed(params.seed)
            self._seeded = True
        out: list[Generation] = []
        for start in range(0, len(requests), self.max_batch):
            out.extend(self._generate_batch([r.prompt_ids for r in requests[start:start + self.max_batch]], params))
        return out

    def _generate_batch(self, prompts: list[list[int]], params: SamplingParams) -> list[Generation]:
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
        gens = []
        stop = set(self.stop)
        for row in range(len(prompts)):
            tokens = new[row].tolist()
            end = next((i + 1 for i, t in enumerate(tokens) if t in stop), None)
            finish = "stop" if end is not None else "length"
            end = end or len(tokens)
            gens.append(Generation(tokens[:end], logprobs[row, :end].tolist(), finish_reason=finish))
        return gens

    def close(self) -> None:
        self.model = None
