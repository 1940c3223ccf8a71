"""API keys: who is calling steward, and what they may do.

    keys      ApiKey, the key file (hashed keys, written atomically under a lock), KeyTable for lookups
    limits    KeyLimiter: requests per minute and at once per key; pure, with an explicit ``now``
    watch     serve_key_file: reload the key file while steward runs, keep the old keys if it turns bad
    commands  ``steward keys add|list|remove``

The door (the middleware that checks each request's key) uses ``KeyTable.lookup``, the
``ApiKey`` permissions and ``KeyLimiter``; it lives with the gateway.

Nothing is imported here: ``steward keys`` and ``check`` read keys without the watcher's trio.
"""
