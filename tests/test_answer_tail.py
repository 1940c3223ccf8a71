"""supervisor.gateway.answer_tail: an answer's last bytes and whether it ended on a stream's last event."""

from __future__ import annotations

import json

import pytest

from supervisor.gateway.answer_tail import TAIL, AnswerTail


def fed(*chunks: bytes) -> AnswerTail:
    tail = AnswerTail()
    for chunk in chunks:
        tail.add(chunk)
    return tail


def test_the_tail_is_the_answers_last_bytes_however_it_came() -> None:
    chunks = [bytes([65 + n % 26]) * (n * 37 % 900 + 1) for n in range(200)]
    tail = fed(*chunks)
    assert tail.bytes() == b"".join(chunks)[-TAIL:]
    tail.add(b"end")
    assert tail.bytes() == (b"".join(chunks) + b"end")[-TAIL:]
    assert not AnswerTail() and tail


@pytest.mark.parametrize("last", [
    b"data: [DONE]\n\n",
    b'event: message_stop\ndata: {"type": "message_stop"}\n\n',
    b'{"model":"gemma3:4b","created_at":"2026-12-04T09:00:00Z","message":{"role":"assistant","content":""},'
    b'"done_reason":"stop","done":true,"total_duration":1}\n',
    b'event: response.completed\ndata: {"type":"response.completed","response":{"status":"completed"}}\n\n',
])
def test_a_streams_last_event_ends_it_only_once_its_line_is_whole(last: bytes) -> None:
    before = b'data: {"choices": [{"delta": {"content": "hi"}}]}\n\n'
    assert not fed(before).at_stream_end
    assert fed(before, last).at_stream_end
    assert fed(before + last).at_stream_end
    assert not fed(before, last.rstrip(b"\n")).at_stream_end  # its line is not over yet
    assert not fed(before, last, before).at_stream_end


def test_a_last_event_longer_than_the_tail_still_ends_the_stream() -> None:
    """A Responses answer that repeats an agent's tools: its response.completed line is tens of KB."""
    tools = [{"type": "function", "name": f"tool_{n}", "description": "x" * 400} for n in range(60)]
    event = json.dumps({"type": "response.completed", "response": {"tools": tools, "usage": {"input_tokens": 7}}})
    line = f"event: response.completed\ndata: {event}\n\n".encode()
    assert len(line) > 3 * TAIL
    pieces = [line[i:i + 1000] for i in range(0, len(line), 1000)]
    tail = fed(b'data: {"type":"response.output_text.delta","delta":"hi"}\n\n', *pieces)
    assert tail.at_stream_end and tail.bytes().endswith(b'"usage": {"input_tokens": 7}}}\n\n')


def test_text_that_quotes_a_last_event_does_not_end_the_stream() -> None:
    quoted = json.dumps({"message": {"content": '"done": true and data: [DONE]'}, "done": False}).encode()
    assert not fed(quoted + b"\n").at_stream_end
