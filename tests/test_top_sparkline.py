"""steward top's history lines: figures as block heights, pure."""

from __future__ import annotations

from supervisor.top.sparkline import sparkline
from supervisor.top.view import Frame
from tests.test_top import GIB, URL, hot_ollama_state, screen


def test_heights_scale_to_the_largest_shown_and_zero_is_the_lowest_block() -> None:
    assert sparkline([0, 1, 2, 4, 8], 10) == "▁▁▂▄█"


def test_only_the_last_values_that_fit_are_shown() -> None:
    assert sparkline([8, 8, 8, 0, 4], 2) == "▁█"
    assert sparkline([1, 2], 0) == ""


def test_a_ceiling_scales_to_it_and_a_missing_sample_is_a_gap() -> None:
    assert sparkline([4, None, 16, 20], 10, ceiling=16) == "▂ ██"
    assert sparkline([None, float("nan")], 5) == "  "


def sample(held_gib: float, queued: int, tokens: float) -> dict[str, object]:
    """One sample as GET /admin/history serves it."""
    tiers = {"pinned": 0, "hot": int(held_gib * GIB), "cold": 0, "asleep": 0, "freeing": 0, "exclusive": 0}
    return {"ts": 1.0, "devices": {"gpu0": tiers}, "queued": {"interactive": queued, "background": 0, "batch": 0},
            "running": {}, "tokens_per_s": tokens, "rejected": 0, "rejected_by": {}}


def test_top_draws_the_last_minutes_as_sparklines_under_the_memory_bar() -> None:
    history = [sample(2, 0, 0), sample(8, 3, 40), sample(16, 6, 80), sample(12, 0, 20)]
    state = hot_ollama_state()  # a 10 GiB card
    lines = screen(Frame(URL, state, state["events"], history=tuple(history)))
    [line] = [line for line in lines if line.startswith("last ")]
    assert line == "last 40s  memory ▂▇██ 12.0 GiB  queued ▁▄█▁ 0  tokens/s ▁▄█▂ 20"
    assert lines.index(line) == 3  # right under the device's bar and its legend
    assert all(len(text) <= 80 for text in lines)
    assert not [text for text in screen(Frame(URL, state, state["events"], history=tuple(history[:1])))
                if text.startswith("last ")]  # one sample says nothing yet


async def test_top_reads_the_samples_from_admin_history_and_takes_an_old_stewards_404_as_none() -> None:
    import httpx
    import pytest

    from supervisor.top.client import Unreachable, fetch_history

    def steward(request: httpx.Request) -> httpx.Response:
        if request.url.host == "old":
            return httpx.Response(404, text="not found")
        return httpx.Response(200, json={"interval_s": 10, "samples": [sample(2, 0, 0), "junk", sample(4, 1, 10)]})

    async with httpx.AsyncClient(transport=httpx.MockTransport(steward)) as client:
        assert await fetch_history(client, "http://new") == [sample(2, 0, 0), sample(4, 1, 10)]
        with pytest.raises(Unreachable):
            await fetch_history(client, "http://old")
