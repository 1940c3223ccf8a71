"""``steward simulate``: replay a workload in virtual time through the real decision core
and through baseline policies, on a simulated GPU that engines share (docs/simulator.md).

Modules: scenario (the YAML), sharing (how engines split the GPU), gpu (the card and
its running steps), workload (clients and requests), baselines and policies (who
decides), runner (the event loop), metrics and report (what comes out).
"""

from supervisor.simulate.report import Report, format_report, simulate
from supervisor.simulate.scenario import Scenario, default_scenario, load_scenario

__all__ = ["Report", "Scenario", "default_scenario", "format_report", "load_scenario", "simulate"]
