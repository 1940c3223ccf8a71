"""steward top's history lines: figures as block heights, pure."""

from __future__ import annotations

from supervisor.top.sparkline import sparkline


def test_heights_scale_to_the_largest_shown_and_zero_is_the_lowest_block() -> None:
    assert sparkline([0, 1, 2, 4, 8], 10) == "▁▁▂▄█"


def test_only_the_last_values_that_fit_are_shown() -> None:
    assert sparkline([8, 8, 8, 0, 4], 2) == "▁█"
    assert sparkline([1, 2], 0) == ""


def test_a_ceiling_scales_to_it_and_a_missing_sample_is_a_gap() -> None:
    assert sparkline([4, None, 16, 20], 10, ceiling=16) == "▂ ██"
    assert sparkline([None, float("nan")], 5) == "  "
