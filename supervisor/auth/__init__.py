"""API keys: who is calling steward, and what they may do.

    keys      ApiKey, the key file (hashed keys, written atomically under a lock), KeyTable for lookups
    limits    KeyLimiter: requests per minute and at once per key; pure, with an explicit ``now``
    watch     serve_key_file: reload the key file while steward runs, keep the old keys if it turns bad
    commands  ``steward keys add|list|remove``

The door (the middleware that checks each request's key) uses ``KeyTable.lookup``, the
``ApiKey`` permissions and ``KeyLimiter``; it lives with the gateway.
"""

from supervisor.auth.keys import (
    ApiKey,
    KeyCommandError,
    KeyFile,
    KeyFileError,
    KeyTable,
    add_key,
    list_keys,
    load_key_file,
    remove_key,
)
from supervisor.auth.limits import Admission, KeyLimiter, RefusalReason, Refused
from supervisor.auth.watch import serve_key_file

__all__ = [
    "Admission", "ApiKey", "KeyCommandError", "KeyFile", "KeyFileError", "KeyLimiter", "KeyTable", "RefusalReason",
    "Refused", "add_key", "list_keys", "load_key_file", "remove_key", "serve_key_file",
]
