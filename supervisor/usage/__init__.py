"""The usage log: one SQLite row per HTTP request on every listener, and ``steward usage`` to read it.

``row`` is the row, ``writer`` the task that owns the database (batched, threaded, never
blocking a request), ``report`` and ``commands`` the reading side.
"""

from supervisor.usage.row import UsageRow as UsageRow
from supervisor.usage.writer import UsageLog as UsageLog
from supervisor.usage.writer import UsageLogUnavailable as UsageLogUnavailable
from supervisor.usage.writer import serve_usage_log as serve_usage_log
