"""What a request body asks for: JSON, prompts and their token counts, a Job, embedding inputs.

Prompt tokens are counted as a real engine counts them (``fakes.chat_tokens``): a chat is first
rendered by the fake model's chat template (``fakes.chat_template``: roles, system prompt, the
tools' JSON schemas), then counted; a text prompt is counted as it is. The Responses and
Anthropic routes turn their requests into a chat first, as llama-server does.

The fake model's answer (``Job.answer``): without ``max_tokens`` (``n_predict``) it says
``--max-tokens-default`` words and then an end-of-generation token (finish "stop"), as a model
ends its reply long before llama-server's unlimited default; with a budget it talks until the
budget (or the context) runs out ("length"). A chat that offers tools gets a tool call or an
answer about a tool's result where ``fakes.tool_reply`` says so; a chat that dictates its
answer ("Reply exactly: ...") gets it.
"""

from __future__ import annotations

import json
import re
from typing import Any

import attrs

from fakes.chat_template import CALL_TAIL, Chat, ChatMessage, ToolCall, call_head, openai_chat
from fakes.chat_tokens import count_tokens, pieces
from fakes.http11 import Request
from fakes.llama_server.cli import Config
from fakes.llama_server.errors import invalid_request
from fakes.llama_server.formats import token_piece
from fakes.tool_reply import dictated_reply, tool_reply

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
    # The answer is this tool call: ``answer`` holds its tokens, "" for those around the arguments.
    call: ToolCall | None = None

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
    """A message's text parts joined by spaces (the fake Ollama's count, by words)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict) and p.get("type") == "text")
    return ""


def chat_request(body: dict[str, Any]) -> Chat:
    messages = body.get("messages")
    if messages is None:
        raise invalid_request("'messages' is required")
    if not isinstance(messages, list):
        raise invalid_request("Expected 'messages' to be an array")
    return openai_chat(body)


def user_chat(text: str) -> Chat:
    return Chat((ChatMessage("user", text),))


def chat_job(chat: Chat, body: dict[str, Any], cfg: Config) -> Job:
    """The job of a request converted to *chat*; *body* holds its chat parameters (max_tokens, stream)."""
    prompt = chat.prompt
    job = build_job(body, cfg, prompt, count_tokens(prompt))
    reply = tool_reply(chat) or dictated_reply(chat)
    if isinstance(reply, ToolCall):
        hidden = ("",) * len(pieces(call_head(reply.name)))
        return attrs.evolve(job, answer=(*hidden, *pieces(reply.arguments), *("",) * len(pieces(CALL_TAIL))),
                            call=reply)
    if isinstance(reply, str):
        return attrs.evolve(job, answer=tuple(pieces(reply)))
    return job


def chat_prefill(chat: Chat) -> str:
    """The text of a last assistant message, which llama-server continues (an assistant prefill); "" if none."""
    last = chat.messages[-1] if chat.messages else None
    return last.content if last is not None and last.role == "assistant" else ""


def continuing(job: Job, prefill: str) -> Job:
    """*job* continuing *prefill*: its tokens go on from there; FAKE_STOP_AFTER_n ends the whole answer at n."""
    stop = STOP_HOOK.search(job.prompt_text)
    if job.call is not None or (not prefill and stop is None):
        return job
    offset = count_words(prefill)
    if stop is not None:
        answer: tuple[str, ...] | None = tuple(token_piece(i) for i in range(offset, max(offset, int(stop[1]))))
    else:
        answer = None if job.answer is None else tuple(token_piece(offset + i) for i in range(len(job.answer)))
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
            n_tokens += count_tokens(piece)
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
    unlimited = requested is None or requested < 0  # llama-server's n_predict -1: no limit
    return Job(n_prompt=n_prompt, budget=-1 if unlimited else requested,
               stream=bool(body.get("stream", False)), ping_interval=float(ping), prompt_text=prompt_text,
               answer=default_reply(cfg) if unlimited else None)


def default_reply(cfg: Config) -> tuple[str, ...]:
    """What the fake model says when nothing limits it: ``--max-tokens-default`` words, then it ends."""
    return tuple(token_piece(i) for i in range(cfg.max_tokens_default))


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
            inputs.append((item, max(1, count_tokens(item))))
        elif isinstance(item, list) and item and all(isinstance(t, int) for t in item):
            inputs.append((" ".join(map(str, item)), len(item)))
        else:
            raise invalid_request('"input" must be a string, a list of strings or a list of tokens')
    return inputs
