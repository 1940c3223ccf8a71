"""The ``steward`` command's exit statuses beside 0 (done) and 1 (failed), for every command."""

from __future__ import annotations

EXIT_CONFIG = 2  # a config, a file it names or a command line that steward refuses
EXIT_NO_DEVICE = 3  # steward gpu-check: no NVIDIA driver (NVML cannot start), so nothing was checked
