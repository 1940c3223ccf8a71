"""The answer names the model that served it: the ``ModelNamed`` reader fed the ASGI messages of answers.

No sockets: each test hands it the messages a relay would send and looks at what it sent on.
tests/test_nodes.py checks the same with the official client, through a front door and a node.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from supervisor.gateway.relay import answer_model
from supervisor.gateway.relay.answer_model import ModelNamed
from tests.tapped import Fed, fed

JSON = b"application/json"
EVENTS = b"text/event-stream"
ENGINE = b'"model":"/models/qwen3-8b-Q4_K_M.gguf"'  # what the node's engine calls itself
STEWARD = b'"model":"little"'


def recorded() -> tuple[Fed, list[dict[str, Any]]]:
    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    return fed(send, ModelNamed("little")), sent


def start(content_type: bytes, status: int = 200, length: int | None = None) -> dict[str, Any]:
    headers = [(b"content-type", content_type), (b"x-request-id", b"r1")]
    if length is not None:
        headers.append((b"content-length", str(length).encode()))
    return {"type": "http.response.start", "status": status, "headers": headers}


def body(chunk: bytes, *, more: bool = True) -> dict[str, Any]:
    return {"type": "http.response.body", "body": chunk, "more_body": more}


async def answer(named: Fed, first: dict[str, Any], *chunks: bytes) -> None:
    await named(first)
    for number, chunk in enumerate(chunks, 1):
        await named(body(chunk, more=number < len(chunks)))


def bodies(sent: list[dict[str, Any]]) -> bytes:
    return b"".join(m["body"] for m in sent if m["type"] == "http.response.body")


async def test_a_json_answer_in_several_messages_is_held_whole_and_its_length_fixed() -> None:
    named, sent = recorded()
    text = b'{"id":"chatcmpl-1",' + ENGINE + b',"choices":[{"message":{"content":"h\xc3\xa9"}}],"created":1}'
    await named(start(JSON, length=len(text)))
    await named(body(text[:7]))
    await named(body(text[7:30]))
    assert sent == []  # the start waits too: its content-length is still to change
    await named(body(text[30:], more=False))
    renamed = text.replace(ENGINE, STEWARD)
    assert sent == [{"type": "http.response.start", "status": 200, "headers": [
        (b"content-type", JSON), (b"x-request-id", b"r1"), (b"content-length", str(len(renamed)).encode())]},
        body(renamed, more=False)]
    assert json.loads(renamed)["choices"][0]["message"]["content"] == "hé"  # the rest as it was, keys in order


async def test_a_json_answer_without_a_length_keeps_going_without_one() -> None:
    named, sent = recorded()
    await answer(named, start(b"application/json; charset=utf-8"), b'{' + ENGINE, b', "object": "list"}')
    assert sent[0]["headers"] == [(b"content-type", b"application/json; charset=utf-8"), (b"x-request-id", b"r1")]
    assert json.loads(bodies(sent)) == {"model": "little", "object": "list"}


@pytest.mark.parametrize("text", [
    b'[{"model":"qwen"}]',  # not an object
    b'"model"',
    b'{"object":"list","data":[{"model":"qwen"}]}',  # no model at the top
    b'{"model":"little",  "spaced": true}',  # named already: its bytes kept
    b'{"model":"qwen", "cut short',  # an answer the node broke off
    b'\xff{"model":"qwen"}',
    b'[' * 100_000 + b']' * 100_000,
])
async def test_a_json_body_that_is_no_object_with_another_model_goes_unchanged(text: bytes) -> None:
    named, sent = recorded()
    await answer(named, start(JSON, length=len(text)), text[:3], text[3:])
    assert sent == [start(JSON, length=len(text)), body(text, more=False)]


async def test_a_lone_surrogate_stays_escaped() -> None:
    named, sent = recorded()
    await answer(named, start(JSON), b'{"model":"qwen","text":"\\ud800 \\u00e9"}')
    assert bodies(sent) == b'{"model":"little","text":"\\ud800 \\u00e9"}'  # valid UTF-8, no surrogate in it


@pytest.mark.parametrize(("first", "text"), [
    (start(JSON, status=500), b'{"model":"qwen","error":{"message":"boom"}}'),  # an error answer
    (start(EVENTS, status=503), b'data: {"model":"qwen"}\n\n'),
    (start(b"application/x-ndjson"), b'{"model":"qwen","done":false}\n'),  # another framing
    (start(b"text/plain"), b'{"model":"qwen"}'),
    (start(EVENTS, length=24), b'data: {"model":"qwen"}\n\n'),  # of announced length: it cannot change
])
async def test_other_answers_go_through_untouched_and_at_once(first: dict[str, Any], text: bytes) -> None:
    named, sent = recorded()
    await named(first)
    await named(body(text[:5]))
    assert sent == [first, body(text[:5])]  # nothing held
    await named(body(text[5:], more=False))
    assert sent == [first, body(text[:5]), body(text[5:], more=False)]


# An engine's stream, event by event: what it sends, and what the client is to get.
STREAM = [
    (b'data: {"id":"c1",' + ENGINE + b',"choices":[{"delta":{"content":"h\xc3\xa9 \\"model\\""}}]}\n\n', STEWARD),
    (b': a comment, "model" in it\n\n', None),
    (b'data:{"id":"c1",' + ENGINE + b',"choices":[{"delta":{"content":"{"}}]}\r\n\r\n', STEWARD),  # CRLF, no space
    (b'event: chunk\ndata: {' + ENGINE + b'}\nid: 3\n\n', STEWARD),
    (b'data: {"choices":[{"delta":{"content":"\\"model\\":\\"x\\""}}]}\n\n', None),  # none at the top
    (b'data: {"model": not json}\n\n', None),
    (b'data: {"model":"little", "choices":[]}\n\n', None),  # named already
    (b'data: [DONE]\n\n', None),
]
STREAM_IN = b"".join(event for event, _ in STREAM)
STREAM_OUT = b"".join(event if named is None else event.replace(ENGINE, named) for event, named in STREAM)


def complete_events(received: int) -> int:
    """How much of STREAM_OUT the client must have once *received* bytes of STREAM_IN came: every event
    whose end came, nothing of the one still cut."""
    done_in = done_out = 0
    for event, named in STREAM:
        if done_in + len(event) > received:
            break
        done_in += len(event)
        done_out += len(event if named is None else event.replace(ENGINE, named))
    return done_out


async def test_a_stream_cut_anywhere_has_every_event_renamed_as_soon_as_it_ends() -> None:
    for cut in range(1, len(STREAM_IN)):  # inside a JSON object, between the two newlines, between \r and \n...
        named, sent = recorded()
        await named(start(EVENTS))
        await named(body(STREAM_IN[:cut]))
        assert bodies(sent) == STREAM_OUT[:complete_events(cut)], cut  # no more than the cut event held back
        await named(body(STREAM_IN[cut:], more=False))
        assert bodies(sent) == STREAM_OUT, cut
        assert sent[0] == start(EVENTS) and all(m["body"] for m in sent[1:-1]), cut  # no empty messages sent


async def test_a_stream_a_byte_at_a_time_holds_back_only_the_event_it_is_in() -> None:
    named, sent = recorded()
    await named(start(EVENTS))
    for received in range(1, len(STREAM_IN) + 1):
        await named(body(STREAM_IN[received - 1:received], more=received < len(STREAM_IN)))
        assert bodies(sent) == STREAM_OUT[:complete_events(received)], received
    assert bodies(sent) == STREAM_OUT and not sent[-1]["more_body"]


async def test_a_stream_that_ends_inside_an_event_sends_it_as_it_came() -> None:
    named, sent = recorded()
    unfinished = b'data: {' + ENGINE + b'}\n'  # no blank line after it: no event
    await answer(named, start(EVENTS), STREAM_IN[:50], STREAM_IN[50:] + unfinished)
    assert bodies(sent) == STREAM_OUT + unfinished


async def test_an_event_too_long_to_hold_ends_the_renaming(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(answer_model, "MAX_HELD_BYTES", 64)
    named, sent = recorded()
    first, second = STREAM[0][0], STREAM[2][0]
    long = b'data: {"model":"qwen","text":"' + b"x" * 100
    await answer(named, start(EVENTS), first + long, b'"}\n\n' + second)
    assert bodies(sent) == first.replace(ENGINE, STEWARD) + long + b'"}\n\n' + second  # the rest as it came


async def test_a_json_answer_too_large_to_hold_goes_as_it_came(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(answer_model, "MAX_HELD_BYTES", 64)
    named, sent = recorded()
    text = b'{' + ENGINE + b',"data":[' + b"0.5," * 40 + b'1]}'
    await named(start(JSON, length=len(text)))
    await named(body(text[:40]))
    assert sent == []
    await named(body(text[40:80]))
    assert sent == [start(JSON, length=len(text)), body(text[:80])]
    await named(body(text[80:], more=False))
    assert bodies(sent) == text


async def test_what_is_held_of_an_answer_broken_off_is_sent_as_it_came() -> None:
    named, sent = recorded()
    await named(start(JSON, length=100))
    await named(body(b'{' + ENGINE))  # the node went away: the last message never comes
    await named.send_held()
    assert sent == [start(JSON, length=100), body(b'{' + ENGINE)]  # incomplete: the client sees it was cut
    await named.send_held()
    assert len(sent) == 2

    named, sent = recorded()
    await answer(named, start(EVENTS), STREAM_IN)
    await named.send_held()  # an answer that ended: nothing held
    assert bodies(sent) == STREAM_OUT and len(sent) == 2
