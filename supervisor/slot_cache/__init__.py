"""A conversation's KV cache survives its model's eviction (models.NAME.keep_cache, kv_cache).

When steward evicts a llama-server, it drains it, then (before the stop) saves the slots that
hold the most cached tokens to files (llama-server's ``--slot-save-path`` and
``POST /slots/{id}?action=save``); when it loads that model again, it restores them before the
engine takes work (``action=restore``), so that llama-server's own choice of slot by prompt
similarity finds the conversation's prompt computed already: the next turn reads only what is new.

    plan.py         one model's keep_cache and kv_cache bounds, resolved from the config
    store.py        the cache folder: one folder per model, its manifest, the total cap, expiry
    fingerprint.py  what must not have changed for a restore (model file, context, slots, cache types, build)
    llama.py        llama-server's slot API (GET /slots, /props; POST /slots/{id}?action=...)
    keeper.py       the save after a drain and the restore before ready, bounded in time, as events
"""
