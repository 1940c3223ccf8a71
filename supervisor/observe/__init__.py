"""What steward shows: the event log, Prometheus metrics, /healthz, alerts, slowdown figures.

Every decision that matters is one event in ``events``; ``metrics``, ``health`` and ``alerts``
count and judge from those events and the scheduler's snapshots, never from private state.
"""
