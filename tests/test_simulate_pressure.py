"""The pressure scenario (issue 31): GridCore's load plus interactive chats for a model that
does not fit beside the hot ones. Its fallback chain (to the smaller model of its family)
halves interactive p95 or better against the same steward without the chain. Virtual time,
so exact and independent of the machine."""

from __future__ import annotations

import attrs
import pytest

from supervisor.tools.simulate import builtin_scenario, simulate


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_fallback_to_the_smaller_variant_at_least_halves_interactive_p95(seed: int) -> None:
    report = simulate(attrs.evolve(builtin_scenario("pressure"), seed=seed), ["steward", "no-fallback"])
    steward, without = report.policies["steward"], report.policies["no-fallback"]
    p95, p95_without = steward.classes["interactive"].p95_s, without.classes["interactive"].p95_s
    assert p95 is not None and p95_without is not None and p95 <= p95_without / 2
    assert steward.fallbacks > 0 and without.fallbacks == 0
    assert steward.classes["interactive"].errors == 0
    assert steward.loads < without.loads  # the large model's loads (and the 12B's reloads) are spared
