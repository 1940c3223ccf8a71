"""One request as the usage log keeps it: a row of the table ``requests``.

The gateway builds a ``UsageRow`` when a request's answer ends, whatever the end: served,
rejected (401, 403, 413, 429, 503), failed, or cancelled because the client left (499).
Rejected rows matter as much as served ones: they are how one sees who was turned away.
"""

from __future__ import annotations

import attrs

from supervisor.safe_text import recordable

TABLE = "requests"
# Bumped when the table changes; the writer refuses a database written by a newer steward, and
# adds to an older one's table the columns it lacks (ADDED_COLUMNS: the version that added them).
SCHEMA_VERSION = 5
ADDED_COLUMNS: dict[int, tuple[tuple[str, str], ...]] = {2: (("decode_tps", "REAL"), ("slowdown", "REAL")),
                                                         3: (("gpu_s", "REAL"),), 4: (("cost", "REAL"),),
                                                         5: (("input_chars", "INTEGER"), ("audio_s", "REAL"))}


@attrs.frozen
class UsageRow:
    ts: float  # wall-clock time the request arrived (Unix seconds)
    request_id: str
    key: str | None  # the caller's key name; None when steward runs without keys
    listener: str  # "openai" | "ollama" | "comfyui"
    method: str
    route: str  # the path, e.g. "/v1/chat/completions"
    model: str | None  # the model steward resolved (an alias's target), or the name sent to Ollama
    engine: str | None  # the engine that served it ("ollama" for Ollama, None if none was granted)
    klass: str | None  # "interactive" | "background" | "batch" (column: class)
    status: int  # the HTTP status the client got; 499: the client left first; a failed stream's (docs/events.md)
    error: str | None  # the error code ("queue_full", the engine's "server_error"), None if ok (docs/events.md)
    queued_s: float | None  # seconds waited in steward's queue for a grant (None: never queued)
    ttft_s: float | None  # seconds from arrival to the first byte of the answer body
    duration_s: float  # seconds from arrival to the end of the answer
    prompt_tokens: int | None
    completion_tokens: int | None
    request_bytes: int
    response_bytes: int
    # Tokens per second after the first (the engine's timings, else the stream as it came); None: not told.
    decode_tps: float | None = None
    # How many times slower than its engine decodes alone (supervisor/observe/slowdown.py); None: not known.
    slowdown: float | None = None
    # Seconds it held what it was granted: an engine's slot (each step's, added up) or the whole
    # GPU for an image job; what a key's work cost in GPU time. None: never granted.
    gpu_s: float | None = None
    # What it cost at a remote model's prices (models.NAME.price, per million tokens, in the
    # currency the cloud bills in); None: a model of this machine's.
    cost: float | None = None
    # A speech request's (/v1/audio/speech): the characters of its input, and the seconds of
    # audio its answer carried, read from the audio as it passed (gateway/relay/speech_audio.py;
    # None: not told, as by a FLAC whose header says no length). None on every other route.
    input_chars: int | None = None
    audio_s: float | None = None


# The table's columns, in UsageRow's order; ``class`` is a keyword in Python, not in SQL.
COLUMNS: tuple[str, ...] = tuple("class" if field.name == "klass" else field.name for field in attrs.fields(UsageRow))
_INT64 = 2**63


def column_values(row: UsageRow) -> tuple[str | int | float | None, ...]:
    """*row*'s values as SQLite binds them. A value of a type SQLite has no column for (a caller's
    slip) is written as text, never refused: a row that cannot be written would otherwise hold
    up every row behind it."""
    return tuple(_column_value(value) for value in attrs.astuple(row, recurse=False))


def _column_value(value: object) -> str | int | float | None:
    if isinstance(value, str):
        return recordable(value)
    if value is None or isinstance(value, float):
        return value
    if isinstance(value, int):  # bool and IntEnum too; beyond 64 bits it is no count of anything
        return int(value) if -_INT64 <= value < _INT64 else None
    return recordable(str(value))

