"""A fake of Kokoro-FastAPI (an OpenAI-compatible speech server), for tests and the demo.

Run it from the repository root::

    python -m fakes.speech_server --port 8880 [--chars-per-second 15] [--chunk-seconds 0.25]
        [--real-time-factor 50] [--hold-last FILE] [--memory 1GiB --sim-gpu DIR]

A real HTTP/1.1 server in its own process (trio + h11 through ``fakes.http11``) with the
habits of the server it stands for (``server``): ``POST /v1/audio/speech`` under the model
names ``tts-1``, ``tts-1-hd`` and ``kokoro`` only (a 400 ``invalid_model`` for any other: a
steward in front must send its ``served_name``), Kokoro's voices and OpenAI's names for them,
pydantic's 422s, ``stream`` true by default (the audio chunked as it is made, paced by
``--real-time-factor``: audio seconds per second), ``GET /health`` ``{"status": "healthy"}``,
``GET /v1/audio/voices``, ``GET /v1/models``, uvicorn's access log on stderr.

Its audio is a 400 Hz tone, ``len(input) / --chars-per-second / speed`` seconds long: ``wav``
(its header first, with the whole length) and ``pcm`` (16-bit mono at 24 kHz, as OpenAI's)
written by hand; ``mp3``, ``opus`` (Ogg), ``aac`` (ADTS) and ``flac`` encoded with PyAV as
Kokoro-FastAPI encodes them, each chunk what the encoder made of the audio so far (``encode``:
a streamed FLAC that says no length, Ogg pages about a second apart). Without PyAV (a demo
installed without the test extra) those four are answered as Kokoro-FastAPI answers an
encoding that fails, a 500 ``processing_error``, saying why.

``--hold-last FILE``: a stream's last chunk waits until FILE exists, so that a test sees
chunks arrive before the stream ends. ``GET /fake/stats`` -> ``{"started", "finished",
"cancelled", "running", "last_chunks_sent"}``: a stream whose client left is ``cancelled``.
"""

from fakes.speech_server.server import Config, FakeKokoro, main, parse_config

__all__ = ["Config", "FakeKokoro", "main", "parse_config"]
