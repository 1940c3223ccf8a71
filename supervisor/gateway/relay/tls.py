"""The TLS context a cloud's certificate is checked with (no httpx here: `steward check` reads it too)."""

from __future__ import annotations

import ssl


def tls_context(ca_file: str | None) -> ssl.SSLContext:
    """The system's trusted CAs, and *ca_file*'s besides (OSError, ssl.SSLError: it cannot be read)."""
    context = ssl.create_default_context()
    if ca_file is not None:
        context.load_verify_locations(cafile=ca_file)
    return context
