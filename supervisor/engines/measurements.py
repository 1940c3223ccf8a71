"""Measured memory and load times per model and arguments, kept across restarts of steward.

After an engine's first load its measured memory (NVML per process, or RSS on a
CPU-only host) replaces the estimate, and its load time (decision to ready) tells the
scheduler what evicting it costs. The key is the model file (path, size, mtime) and the
engine's arguments, so a changed file or changed flags are measured afresh.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path

import attrs

from supervisor.config import ModelConfig

# The state file's key for the host's figures (not an engine's measurement key).
HOST_KEY = "host"


def _figure(entry: object, name: str) -> float | None:
    value = entry.get(name) if isinstance(entry, dict) else None
    if isinstance(value, int | float) and not isinstance(value, bool) and 0 <= value < float("inf"):
        return float(value)
    return None


@attrs.frozen
class ContextCost:
    """How an engine slows as its context grows, measured by `steward calibrate` (a long prompt
    beside the short ones): attention reads every token before the one it computes, so each
    token costs more the deeper it sits (SmolLM2-135M on 2 cores: decoding 57 tokens/s after a
    250-token prompt, 34 after 1,500; reading a prompt 181 and 162 tokens/s).

    Each token's time grows linearly with the tokens before it: *prompt_s* more seconds per
    prompt token, *decode_s* per decoded token, for each token of context. The speeds alone
    (EngineSpeed) were measured over prompts of *prompt_context* tokens, and decoding at
    *decode_context* tokens of context (the decoded tokens' mean)."""

    prompt_s: float
    decode_s: float
    prompt_context: float
    decode_context: float

    def decode_tps_moved(self, tps: float, measured_at: float, to: float) -> float:
        """A decode rate measured at *measured_at* tokens of context, as it would be at *to*
        (each token's time moved by ``decode_s`` per token of context; never below 1/100 of it)."""
        return 1.0 / max(1.0 / tps + self.decode_s * (to - measured_at), 1.0 / tps / 100)

    def figures(self) -> dict[str, float]:
        return {"context_prompt_s": self.prompt_s, "context_decode_s": self.decode_s,
                "prompt_context": self.prompt_context, "decode_context": self.decode_context}


@attrs.frozen
class EngineSpeed:
    """An engine's speed measured alone on this host (`steward calibrate`, or steps that ran with
    nothing else computing): tokens per second decoding one slot, reading a prompt, the decode
    rate of all its slots together with two slots busy, and the prompt rate of two slots reading
    prompts at once; how it slows with context; and the prompt tokens per second of an
    embeddings request, for an engine that serves them (None: not measured)."""

    decode_tps: float
    prompt_tps: float | None = None
    two_slots_tps: float | None = None
    two_slots_prompt_tps: float | None = None
    context_cost: ContextCost | None = None
    embedding_tps: float | None = None

    def figures(self) -> dict[str, float]:
        named = {"decode_tps": self.decode_tps, "prompt_tps": self.prompt_tps, "two_slots_tps": self.two_slots_tps,
                 "two_slots_prompt_tps": self.two_slots_prompt_tps, "embedding_tps": self.embedding_tps,
                 **(self.context_cost.figures() if self.context_cost is not None else {})}
        return {k: _rounded_figure(v) for k, v in named.items() if v is not None}

    def decode_tps_at(self, context: float) -> float:
        """Tokens decoded per second alone with *context* tokens before each (decode_tps where
        the context cost was not measured)."""
        cost = self.context_cost
        if cost is None:
            return self.decode_tps
        return cost.decode_tps_moved(self.decode_tps, cost.decode_context, context)

    def at_no_context(self) -> tuple[float, float | None]:
        """The decode and prompt tokens/s alone extrapolated to an empty context (the linear model
        of ContextCost): what a token costs before attention adds its share."""
        cost = self.context_cost
        if cost is None:
            return self.decode_tps, self.prompt_tps
        decode = cost.decode_tps_moved(self.decode_tps, cost.decode_context, 0.0)
        if self.prompt_tps is None:
            return decode, None
        # A prompt of n tokens is read at n / (n/p0 + prompt_s * n**2 / 2): its mean token sits at n/2.
        per_token = 1.0 / self.prompt_tps - cost.prompt_s * cost.prompt_context / 2
        return decode, 1.0 / max(per_token, 1.0 / self.prompt_tps / 100)


def _rounded_figure(value: float) -> float:
    """Three significant decimals for rates and sizes; the tiny per-token costs keep their digits."""
    return round(value, 3) if abs(value) >= 0.01 else float(f"{value:.4g}")


@attrs.frozen
class HostSharing:
    """How engines share this host's compute, measured by `steward calibrate`: k engines computing
    at once each run at 1/k**alpha of their speed alone; n busy slots of one engine do
    1 + batching_gain * (n - 1) times the work of one (supervisor/tools/simulate/sharing.py). Those
    are decoding's figures; reading prompts is bound by compute, not memory, and shares
    otherwise: its own two (None: not measured, decoding's stand for them)."""

    alpha: float
    batching_gain: float
    cores: int
    prefill_alpha: float | None = None
    prefill_batching_gain: float | None = None


def measurement_key(model: ModelConfig) -> str:
    identity: dict[str, object] = {"command": model.command, "model": model.model, "args": model.args,
                                   "parallel": model.parallel, "runtime": model.runtime}
    if model.model is not None:
        try:
            stat = os.stat(model.model)
            identity["file"] = [stat.st_size, stat.st_mtime_ns]
        except OSError:
            identity["file"] = None
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:32]


@attrs.define(eq=False)
class MeasurementStore:
    """A small JSON file: key -> {"bytes", "load_s", "decode_tps", "prompt_tps", "two_slots_tps",
    "two_slots_prompt_tps", "engine", "measured_at"} (any figure may be missing), and HOST_KEY -> the host's sharing
    figures. Written atomically."""

    path: Path | None
    _entries: dict[str, dict[str, object]] = attrs.Factory(dict)

    @classmethod
    def open(cls, path: str | Path | None) -> MeasurementStore:
        if path is None:
            return cls(None)
        path = Path(path)
        try:
            entries = json.loads(path.read_text())
        except FileNotFoundError:
            entries = {}
        except (OSError, ValueError):
            entries = {}  # unreadable: measure again rather than refuse to start
        return cls(path, entries if isinstance(entries, dict) else {})

    def get(self, key: str) -> int | None:
        entry = self._entries.get(key)
        if isinstance(entry, dict) and isinstance(entry.get("bytes"), int):
            return int(entry["bytes"])  # type: ignore[arg-type]
        return None

    def load_time(self, key: str) -> float | None:
        return _figure(self._entries.get(key), "load_s")

    def speed(self, key: str) -> EngineSpeed | None:
        entry = self._entries.get(key)
        decode = _figure(entry, "decode_tps")
        if decode is None or decode == 0:
            return None
        costs = [_figure(entry, name) for name in ("context_prompt_s", "context_decode_s", "prompt_context",
                                                   "decode_context")]
        context_cost = None if any(c is None for c in costs) else ContextCost(*costs)  # type: ignore[arg-type]
        return EngineSpeed(decode, _figure(entry, "prompt_tps"), _figure(entry, "two_slots_tps"),
                           _figure(entry, "two_slots_prompt_tps"), context_cost, _figure(entry, "embedding_tps"))

    def record_speed(self, key: str, engine: str, speed: EngineSpeed) -> str | None:
        return self._update(key, engine, **speed.figures())

    def sharing(self) -> HostSharing | None:
        entry = self._entries.get(HOST_KEY)
        alpha, gain, cores = (_figure(entry, name) for name in ("alpha", "batching_gain", "cores"))
        if alpha is None or gain is None or cores is None:
            return None
        prefill_gain = _figure(entry, "prefill_batching_gain")
        return HostSharing(alpha, min(gain, 1.0), max(int(cores), 1), _figure(entry, "prefill_alpha"),
                           None if prefill_gain is None else min(prefill_gain, 1.0))

    def record_sharing(self, sharing: HostSharing) -> str | None:
        prefill = {name: round(value, 3) for name, value in (("prefill_alpha", sharing.prefill_alpha),
                                                             ("prefill_batching_gain", sharing.prefill_batching_gain))
                   if value is not None}
        return self._update(HOST_KEY, "", alpha=round(sharing.alpha, 3),
                            batching_gain=round(sharing.batching_gain, 3), cores=sharing.cores, **prefill)

    def record(self, key: str, engine: str, nbytes: int) -> str | None:
        """Keep a measurement of memory; returns what failed if the file could not be written
        (the measurement still counts for this run: a read-only disk must not stop steward)."""
        return self._update(key, engine, bytes=nbytes)

    def record_load_time(self, key: str, engine: str, seconds: float) -> str | None:
        """Keep how long a load took, as ``record`` keeps memory. One within a tenth of the
        figure kept is not written again: the file is not rewritten at every load."""
        kept = self.load_time(key)
        if kept is not None and abs(seconds - kept) <= kept / 10:
            return None
        return self._update(key, engine, load_s=round(seconds, 3))

    def _update(self, key: str, engine: str, **figures: object) -> str | None:
        entry = self._entries.get(key)
        kept = entry if isinstance(entry, dict) else {}
        self._entries[key] = kept | figures | {"engine": engine, "measured_at": round(time.time(), 3)}
        if self.path is None:
            return None
        tmp = self.path.with_suffix(self.path.suffix + ".tmp")
        try:
            tmp.write_text(json.dumps(self._entries, indent=1, sort_keys=True))
            os.replace(tmp, self.path)
        except OSError as exc:
            return f"cannot write {self.path}: {exc.strerror or exc}"
        return None
