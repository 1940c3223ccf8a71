"""Anthropic's Messages stream events that every fake server sends alike (llama-server, Ollama)."""

from __future__ import annotations

from typing import Any


def text_piece_events(piece: str, *, first: bool) -> list[dict[str, Any]]:
    """One piece of the answer's text block (index 0): the block's start comes before its first piece."""
    start = [{"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}] if first else []
    return [*start, {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": piece}}]
