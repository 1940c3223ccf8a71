"""One model's keep_cache, resolved from the config: a value (no trio, no httpx), for `steward check` too."""

from __future__ import annotations

import attrs

from supervisor.slot_cache.store import CacheFolder


@attrs.frozen
class SlotCachePlan:
    """One model's keep_cache, resolved from the config (config_policy.py)."""

    folder: CacheFolder
    model: str
    slots: int  # keep_cache.slots
    max_bytes: int  # keep_cache.max_bytes (per save)
    min_tokens: int
    total_bytes: int  # kv_cache.max_bytes (every model's sets together)
    keep_s: float
    save_within: float
    restore_within: float
    cache_types: tuple[str, str]

    @property
    def save_path(self) -> str:
        return str(self.folder.model_dir(self.model))
