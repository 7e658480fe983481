"""Any OpenAI-compatible chat endpoint (a served model) as a policy, for collecting with a stronger model.

Requests go out concurrently (one HTTP call per episode, a thread pool). Replies are text; when the
endpoint returns token logprobs they are kept in the generation's meta, but token ids come from the
rollout's tokenizer, so the run records `exact_tokens = false`.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

import requests as http

from trajlake.collect.policies.base import Generation, Policy, Request, SamplingParams
from trajlake.core.errors import TrajlakeError


class OpenAIPolicy(Policy):
    """`openai:URL#MODEL`: POST {URL}/chat/completions with model MODEL."""

    exact_tokens = False

    def __init__(self, url: str, model: str, *, tokenizer: Any = None, api_key: str | None = None,
                 timeout: float = 120.0, concurrency: int = 16):
        self.url = url.rstrip("/")
        self.model = model
        self.tokenizer = tokenizer
        self.policy_id = f"openai:{self.url}#{model}"
        self.timeout = timeout
        self.concurrency = concurrency
        self.session = http.Session()
        if api_key:
            self.session.headers["Authorization"] = f"Bearer {api_key}"

    def _one(self, request: Request, params: SamplingParams) -> Generation:
        body = {"model": self.model, "messages": request.messages, "max_tokens": params.max_new_tokens,
                "temperature": params.temperature, "top_p": params.top_p}
        try:
            reply = self.session.post(f"{self.url}/chat/completions", json=body, timeout=self.timeout)
            reply.raise_for_status()
            choice = reply.json()["choices"][0]
        except (http.RequestException, KeyError, IndexError, ValueError) as e:
            raise TrajlakeError(f"endpoint {self.url} failed: {e}") from None
        finish = "length" if choice.get("finish_reason") == "length" else "stop"
        return Generation(text=choice["message"]["content"] or "", finish_reason=finish)

    def generate(self, requests: list[Request], params: SamplingParams) -> list[Generation]:
        with ThreadPoolExecutor(max_workers=max(1, min(self.concurrency, len(requests)))) as pool:
            return list(pool.map(lambda r: self._one(r, params), requests))

    def close(self) -> None:
        self.session.close()
