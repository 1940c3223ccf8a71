"""``steward simulate``: replay a workload in virtual time through the real decision core
and through baseline policies, on a simulated GPU that engines share (docs/simulator.md).

Modules: scenario (the YAML; gridcore, thrash and family are built in), sharing (how
engines split the GPU), gpu (the card and its running steps), workload (clients and
requests), baselines and policies (who decides), runner (the event loop), metrics,
targets and report (what comes out).
"""

from supervisor.tools.simulate.report import Report, Sweep, format_report, simulate, simulate_seeds
from supervisor.tools.simulate.scenario import (
    BUILTIN_SCENARIOS,
    Scenario,
    builtin_scenario,
    default_scenario,
    load_scenario,
    parse_seeds,
)

__all__ = ["BUILTIN_SCENARIOS", "Report", "Scenario", "Sweep", "builtin_scenario", "default_scenario",
           "format_report", "load_scenario", "parse_seeds", "simulate", "simulate_seeds"]
