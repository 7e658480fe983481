"""Exact token bookkeeping for multi-turn chats, shared by importers and the rollout loop.

The store keeps, for every turn of an episode, only the tokens that are new since the previous turn:

* ``prompt_token_ids``: what the chat template renders for the message(s) since the previous agent reply
  (observations, system text, context replies), ending with the generation prompt, e.g.
  ``<|im_end|>`` ... ``\\n<|im_start|>user\\nobs<|im_end|>\\n<|im_start|>assistant\\n``;
* ``response_token_ids``: the agent's tokens, i.e. the reply as the template renders it followed by the
  end-of-turn token when the template closes assistant messages with one (``<|im_end|>``).

Whatever the template writes after the end-of-turn token (ChatML's ``\\n``) belongs to the NEXT turn's
prompt, because that is when the model first sees it: a sampler stops at the end-of-turn token. So the
concatenation of prompt + response ids over all turns is exactly the sequence the model saw, and the loss
mask is 1 exactly on response ids (`full_sequence`).

Everything is derived from ``tokenizer.apply_chat_template(..., tokenize=False)`` by rendering prefixes of
the conversation and taking text differences, so any template works as long as it is *prefix-stable*:
rendering messages[:k] (with or without the generation prompt) is a text prefix of rendering more
messages. Templates that rewrite history (e.g. drop earlier reasoning) are refused with a
`ChatTemplateError`, since no single token sequence would then describe the episode. Each new text piece
is tokenized on its own with ``add_special_tokens=False`` (special tokens written in the text map to their
ids); that is also what a rollout does, which tokenizes each new prompt piece and samples the reply.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from trajlake.core.errors import TrajlakeError

#: End-of-turn markers of common chat templates, tried after the tokenizer's own eos token.
END_OF_TURN_CANDIDATES = (
    "<|im_end|>", "<|eot_id|>", "<end_of_turn>", "<|end|>", "<|eom_id|>", "<|endoftext|>", "</s>",
    "<|end_of_text|>",
)
#: Stand-in reply used to learn how a template wraps an assistant message it does not render verbatim.
_SENTINEL = "@@trajlake-reply-sentinel@@"  # no whitespace at its ends, so trimming leaves it whole


class ChatTemplateError(TrajlakeError):
    """The tokenizer's chat template cannot give exact per-turn tokens (missing, or not prefix-stable)."""


Message = Mapping[str, Any]


class ChatRenderer:
    """Render conversations with a tokenizer's chat template and split them into per-turn token ids.

    `segments(messages)` handles a whole conversation; `conversation()` starts an incremental one for a
    rollout loop. `end_of_turn` overrides the detected end-of-turn token (text form).
    """

    def __init__(self, tokenizer: Any, *, end_of_turn: str | None = None):
        if not getattr(tokenizer, "chat_template", None):
            name = getattr(tokenizer, "name_or_path", type(tokenizer).__name__)
            raise ChatTemplateError(f"tokenizer {name!r} has no chat template; set tokenizer.chat_template")
        self.tokenizer = tokenizer
        if end_of_turn is not None:
            self.end_of_turn: tuple[str, ...] = (end_of_turn,)
        else:
            # Only strings that are special tokens of this tokenizer count (a plain-text "</s>" is content).
            # Longest first, so a marker is never mistaken for a shorter one that happens to prefix it.
            specials = set(getattr(tokenizer, "all_special_tokens", ()) or ())
            specials |= set(getattr(tokenizer, "get_added_vocab", dict)())
            eos = getattr(tokenizer, "eos_token", None)
            cands = ([eos] if eos else []) + [c for c in END_OF_TURN_CANDIDATES if c in specials]
            self.end_of_turn = tuple(sorted(dict.fromkeys(cands), key=len, reverse=True))

    @functools.cached_property
    def template_end_of_turn(self) -> str | None:
        """The end-of-turn token this template writes after an assistant message, if any."""
        probe = self.render([{"role": "user", "content": "x"}, {"role": "assistant", "content": _SENTINEL}])
        closing = probe[probe.index(_SENTINEL) + len(_SENTINEL):] if _SENTINEL in probe else ""
        return next((e for e in self.end_of_turn if closing.startswith(e)), None)

    # ---- rendering and tokenizing ------------------------------------------------------------
    def render(self, messages: Sequence[Message], *, generation_prompt: bool = False) -> str:
        """The template's text for `messages`, optionally ending with the generation prompt."""
        try:
            text = self.tokenizer.apply_chat_template(
                [dict(m) for m in messages], tokenize=False, add_generation_prompt=generation_prompt
            )
        except Exception as e:  # jinja errors (e.g. "roles must alternate") are the template's verdict
            raise ChatTemplateError(f"chat template refused the conversation: {e}") from e
        if not isinstance(text, str):
            raise ChatTemplateError(f"apply_chat_template(tokenize=False) returned {type(text).__name__}")
        return text

    def encode(self, text: str) -> list[int]:
        """Token ids of one text piece: no BOS/EOS added, special tokens in the text become their ids."""
        return self.encode_many([text])[0]

    def encode_many(self, texts: Sequence[str]) -> list[list[int]]:
        """`encode` for many pieces in one (batched, multi-threaded for fast tokenizers) call."""
        if not texts:
            return []
        # verbose=False: a long piece is not an error here (the sequence limit applies to whole episodes)
        return list(self.tokenizer(list(texts), add_special_tokens=False, verbose=False)["input_ids"])

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False)

    # ---- whole conversations -----------------------------------------------------------------
    def segment_texts(
        self, messages: Sequence[Message], agent: Sequence[bool] | None = None
    ) -> list[tuple[str, str]]:
        """Text form of `segments`: one (prompt_text, response_text) per agent message."""
        agent = _agent_mask(messages, agent)
        conv = self.conversation()
        out = []
        for m, is_agent in zip(messages, agent, strict=True):
            if is_agent:
                prompt = conv._prompt_text()
                out.append((prompt, conv._reply_text(m["content"])))
            else:
                conv.add(m)
        return out

    def segments(
        self, messages: Sequence[Message], agent: Sequence[bool] | None = None
    ) -> list[tuple[list[int], list[int]]]:
        """(prompt_ids, response_ids) for each agent turn of a whole conversation.

        `messages` are chat messages ({role, content}); `agent[i]` says whether message i is an agent turn
        (default: every assistant message). Non-agent messages after the last agent turn are not part of
        any turn (the model never answered them).
        """
        texts = self.segment_texts(messages, agent)
        ids = self.encode_many([t for pair in texts for t in pair])
        return [(ids[2 * i], ids[2 * i + 1]) for i in range(len(texts))]

    def conversation(self, messages: Iterable[Message] = ()) -> Conversation:
        """Start an incremental conversation, e.g. with the system and first user message."""
        conv = Conversation(self)
        conv.add(*messages)
        return conv


class Conversation:
    """An episode in progress: hands out exactly the token ids that are new at each step.

    Rollout use::

        conv = renderer.conversation([system, first_observation])
        prompt_ids = conv.prompt()              # turn 0's prompt_token_ids
        content = conv.reply_ids(sampled_ids)   # store sampled_ids as response_token_ids
        prompt_ids = conv.observe(next_obs)     # turn 1's prompt_token_ids ...

    Teacher forcing (importers): ``conv.reply(text)`` instead of ``reply_ids``.
    """

    def __init__(self, renderer: ChatRenderer):
        self.renderer = renderer
        self.messages: list[dict[str, Any]] = []
        self.text = ""  # the text covered by every id handed out so far
        self._awaiting_reply = False

    def add(self, *messages: Message) -> None:
        """Append non-agent messages (observations, system text, context replies); no tokens yet."""
        if self._awaiting_reply:
            raise ChatTemplateError("the agent's reply to the last prompt must be added before new messages")
        for m in messages:
            if not isinstance(m, Mapping) or "role" not in m or not isinstance(m.get("content"), str):
                raise ChatTemplateError(f"a message must be a mapping with role and str content, got {m!r}")
            self.messages.append(dict(m))

    def observe(self, observation: str | Message, role: str = "user") -> list[int]:
        """Add an observation (text or message) and return the next prompt's new token ids."""
        msg = {"role": role, "content": observation} if isinstance(observation, str) else observation
        self.add(msg)
        return self.prompt()

    def prompt(self) -> list[int]:
        """Ids new since the last reply: the messages added since, then the generation prompt."""
        return self.renderer.encode(self._prompt_text())

    def reply(self, content: str) -> list[int]:
        """Add the agent's reply as text; return its response ids (content + end-of-turn token)."""
        return self.renderer.encode(self._reply_text(content))

    def reply_ids(self, ids: Sequence[int]) -> str:
        """Add the agent's reply as sampled ids (stored as they are); return its content text.

        A trailing end-of-turn token is not part of the content. A reply cut off before it (max tokens)
        simply lacks it, and the template's closing then becomes part of the next prompt.
        """
        if not self._awaiting_reply:
            raise ChatTemplateError("reply_ids() needs a prompt() first")
        text = self.renderer.decode(ids)
        content = text
        # Only the token the template closes assistant messages with ends the turn: another special token
        # that happens to end a reply cut at max tokens (e.g. <|endoftext|>) is part of its content.
        eot = self.renderer.template_end_of_turn
        if eot and text.endswith(eot):
            content = text[: -len(eot)]
        self.messages.append({"role": "assistant", "content": content})
        self.text += text
        self._awaiting_reply = False
        return content

    # ---- text level ----------------------------------------------------------------------------
    def _prompt_text(self) -> str:
        if self._awaiting_reply:
            raise ChatTemplateError("prompt() called twice without a reply in between")
        if not self.messages:
            raise ChatTemplateError("an agent turn needs at least one message before it to prompt with")
        rendered = self.renderer.render(self.messages, generation_prompt=True)
        if not rendered.startswith(self.text):
            raise ChatTemplateError(
                "chat template is not prefix-stable: rendering the conversation so far no longer starts with "
                f"the text already tokenized (they differ from character {_diverge(rendered, self.text)}: "
                f"{self.text[_diverge(rendered, self.text):][:60]!r} became "
                f"{rendered[_diverge(rendered, self.text):][:60]!r}); the template rewrites earlier turns "
                "(or the agent's reply), so no single token sequence describes this episode"
            )
        piece = rendered[len(self.text):]
        self.text = rendered
        self._awaiting_reply = True
        return piece

    def _reply_text(self, content: str) -> str:
        if not self._awaiting_reply:
            raise ChatTemplateError("reply() needs a prompt() first")
        gen = self.text
        msgs = self.messages + [{"role": "assistant", "content": content}]
        full = self.renderer.render(msgs)
        if not full.startswith(gen):
            raise ChatTemplateError(
                "chat template is not prefix-stable: the generation prompt "
                f"{gen[-40:]!r} is not a prefix of the rendered reply (it continues with "
                f"{full[_diverge(full, gen):][:60]!r}); the model would be prompted with text that the "
                "stored conversation does not contain"
            )
        rest = full[len(gen):]
        if rest.startswith(content):
            body, closing = content, rest[len(content):]
        else:
            # The template rewrites the reply (e.g. trims it): learn its wrapping from a sentinel reply,
            # the rendered reply is what lies between that wrapping's two halves.
            probe = self.renderer.render(self.messages + [{"role": "assistant", "content": _SENTINEL}])
            if not probe.startswith(gen) or _SENTINEL not in probe:
                raise ChatTemplateError("chat template does not render the assistant's content")
            closing = probe[probe.index(_SENTINEL) + len(_SENTINEL):]
            if not rest.endswith(closing):
                raise ChatTemplateError("chat template closes assistant messages inconsistently")
            body = rest[: len(rest) - len(closing)]
        eot = next((e for e in self.renderer.end_of_turn if closing.startswith(e)), "")
        response = body + eot
        self.messages = msgs
        self.text = gen + response
        self._awaiting_reply = False
        return response


def full_sequence(turns: Iterable[Any]) -> tuple[list[int], list[int]]:
    """Rebuild an episode's token sequence and loss mask from its stored turns, in turn order.

    `turns` holds (prompt_ids, response_ids) pairs, `Turn` records, or mappings/rows with
    ``prompt_token_ids`` and ``response_token_ids``. Returns (ids, mask) with mask 1 on response ids.
    """
    ids: list[int] = []
    mask: list[int] = []
    for t in turns:
        if isinstance(t, Mapping):
            p, r = t["prompt_token_ids"], t["response_token_ids"]
        elif hasattr(t, "prompt_token_ids"):
            p, r = t.prompt_token_ids, t.response_token_ids
        else:
            p, r = t
        p, r = list(p or ()), list(r or ())
        ids += p + r
        mask += [0] * len(p) + [1] * len(r)
    return ids, mask


def tokenizer_fingerprint(tokenizer: Any) -> str:
    """A short hash of what decides token ids: vocabulary/merges, special tokens and chat template."""
    h = hashlib.sha256()
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        h.update(backend.to_str().encode())
    else:  # slow tokenizers: the vocabulary stands in for the model file
        h.update(repr(sorted(tokenizer.get_vocab().items())).encode())
    h.update(repr(getattr(tokenizer, "chat_template", None)).encode())
    h.update(repr(sorted(getattr(tokenizer, "all_special_tokens", ()) or ())).encode())
    return h.hexdigest()[:16]


def _agent_mask(messages: Sequence[Message], agent: Sequence[bool] | None) -> list[bool]:
    if agent is None:
        return [m.get("role") == "assistant" for m in messages]
    if len(agent) != len(messages):
        raise ValueError(f"agent mask has {len(agent)} entries for {len(messages)} messages")
    return [bool(a) for a in agent]


def _diverge(a: str, b: str) -> int:
    """Index of the first character where `a` and `b` differ."""
    n = min(len(a), len(b))
    return next((i for i in range(n) if a[i] != b[i]), n)
