"""What a request body asks for: JSON, prompts and their token counts, a Job, embedding inputs.

Deterministic "tokenizer": one token per whitespace-separated word, +4 per chat message.
The Responses and Anthropic routes turn their requests into a conversation first, as
llama-server turns them into chat requests, and count it the same way.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

import attrs

from fakes.http11 import Request
from fakes.llama_server.cli import Config
from fakes.llama_server.errors import invalid_request
from fakes.llama_server.formats import token_piece

ERROR_HOOK = "FAKE_ERROR_MIDSTREAM"
CONTINUED_ERROR_HOOK = "FAKE_ERROR_CONTINUING"  # ERROR_HOOK, only in a request that continues a prefill
STOP_HOOK = re.compile(r"FAKE_STOP_AFTER_(\d+)")  # the model ends its answer after that many tokens
CRASH_HOOK = "FAKE_CRASH"
SPLIT_UTF8_HOOK = "FAKE_SPLIT_UTF8"


@attrs.frozen
class Job:
    """What a completion request asks for, already validated."""

    n_prompt: int
    budget: int          # tokens to generate unless the context fills first; -1 = until it does
    stream: bool
    ping_interval: float
    prompt_text: str
    # The fake model's whole answer, one piece per token, ended by an end-of-generation token
    # (finish "stop"); None: VOCAB words until the budget or the context runs out ("length").
    answer: tuple[str, ...] | None = None
    # Tokens the answer already holds: a chat whose last message is the assistant's (a prefill)
    # is continued from there, as llama-server continues it (its words go on where they stopped).
    offset: int = 0

    @property
    def error_hook(self) -> bool:
        return ERROR_HOOK in self.prompt_text or (CONTINUED_ERROR_HOOK in self.prompt_text and self.offset > 0)

    @property
    def crash_hook(self) -> bool:
        return CRASH_HOOK in self.prompt_text

    @property
    def split_utf8_hook(self) -> bool:
        return SPLIT_UTF8_HOOK in self.prompt_text


def body_json(request: Request) -> dict[str, Any]:
    """The body as a JSON object, or the 400 llama-server (nlohmann::json) gives."""
    try:
        # nlohmann::json refuses bytes that are not UTF-8; Python's parser would keep them as surrogates.
        value = json.loads((request.body or b"{}").decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise invalid_request(f"[json.exception.parse_error.101] parse error: syntax error while parsing value "
                              f"- invalid string: ill-formed UTF-8 byte at byte {exc.start + 1}") from None
    except ValueError as exc:
        line, col = getattr(exc, "lineno", 1), getattr(exc, "colno", 1)
        raise invalid_request(f"[json.exception.parse_error.101] parse error at line {line}, column {col}: "
                              f"syntax error while parsing value - {getattr(exc, 'msg', exc)}") from None
    except RecursionError:
        # nlohmann::json has no depth limit; Python's parser stops near 1,000 levels.
        raise invalid_request("the fake cannot parse JSON nested this deeply") from None
    if not isinstance(value, dict):
        raise invalid_request("request body must be a JSON object")
    return value


def count_words(text: str) -> int:
    return len(text.split())


def message_text(content: object) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts; only text parts cost tokens here
        return " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict) and p.get("type") == "text")
    return ""


def conversation(texts: Sequence[str]) -> tuple[str, int]:
    """The prompt text and its token count for chat messages with these texts."""
    return "\n".join(texts), sum(count_words(t) for t in texts) + 4 * len(texts)


def chat_prompt(body: dict[str, Any]) -> tuple[str, int]:
    messages = body.get("messages")
    if messages is None:
        raise invalid_request("'messages' is required")
    if not isinstance(messages, list):
        raise invalid_request("Expected 'messages' to be an array")
    return conversation([message_text(m.get("content")) if isinstance(m, dict) else "" for m in messages])


def chat_prefill(body: dict[str, Any]) -> str:
    """The text of a last assistant message, which llama-server continues (an assistant prefill); "" if none."""
    messages = body.get("messages")
    last = messages[-1] if isinstance(messages, list) and messages else None
    if not isinstance(last, dict) or last.get("role") != "assistant":
        return ""
    return message_text(last.get("content"))


def continuing(job: Job, prefill: str) -> Job:
    """*job* continuing *prefill*: its tokens go on from there; FAKE_STOP_AFTER_n ends the whole answer at n."""
    offset = count_words(prefill)
    stop = STOP_HOOK.search(job.prompt_text)
    answer = None if stop is None else tuple(token_piece(i) for i in range(offset, max(offset, int(stop[1]))))
    return attrs.evolve(job, offset=offset, answer=answer)


def text_prompt(body: dict[str, Any]) -> tuple[str, int]:
    prompt = body.get("prompt")
    if prompt is None:
        raise invalid_request('"prompt" must be provided')
    pieces = prompt if isinstance(prompt, list) else [prompt]
    texts, n_tokens = [], 0
    for piece in pieces:
        if isinstance(piece, str):
            texts.append(piece)
            n_tokens += count_words(piece)
        elif isinstance(piece, int) and not isinstance(piece, bool):
            n_tokens += 1  # already a token id
        elif isinstance(piece, list) and all(isinstance(t, int) for t in piece):
            n_tokens += len(piece)
        else:
            raise invalid_request('"prompt" must be a string, a list of strings or a list of tokens')
    return " ".join(texts), n_tokens


def int_field(body: dict[str, Any], *names: str) -> int | None:
    for name in names:
        value = body.get(name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int | float) or (
                isinstance(value, float) and not value.is_integer()):
            raise invalid_request(f"'{name}' must be an integer")
        return int(value)
    return None


def build_job(body: dict[str, Any], cfg: Config, prompt_text: str, n_prompt: int) -> Job:
    requested = int_field(body, "max_tokens", "max_completion_tokens", "n_predict")
    ping = body.get("sse_ping_interval", cfg.sse_ping_interval)
    if isinstance(ping, bool) or not isinstance(ping, int | float):
        raise invalid_request("'sse_ping_interval' must be a number")
    return Job(n_prompt=n_prompt, budget=cfg.max_tokens_default if requested is None else requested,
               stream=bool(body.get("stream", False)), ping_interval=float(ping), prompt_text=prompt_text)


def embedding_inputs(body: dict[str, Any]) -> list[tuple[str, int]]:
    """(text, n_tokens) per input: a string, a list of strings, tokens or lists of tokens."""
    raw = body.get("input", body.get("content"))
    if raw is None:
        raise invalid_request('"input" or "content" must be provided')
    if isinstance(raw, list) and raw and all(isinstance(t, int) and not isinstance(t, bool) for t in raw):
        raw = [raw]
    items = raw if isinstance(raw, list) else [raw]
    if not items:
        raise invalid_request("Input content cannot be empty")
    inputs = []
    for item in items:
        if isinstance(item, str):
            inputs.append((item, max(1, count_words(item))))
        elif isinstance(item, list) and item and all(isinstance(t, int) for t in item):
            inputs.append((" ".join(map(str, item)), len(item)))
        else:
            raise invalid_request('"input" must be a string, a list of strings or a list of tokens')
    return inputs
