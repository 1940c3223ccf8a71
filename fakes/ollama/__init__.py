"""A fake Ollama server for tests and demos of whatever sits in front of Ollama.

Run it from the repository root::

    python -m fakes.ollama --port 11434 [--host 127.0.0.1] [--sim-gpu DIR] \\
        --model "gemma3:4b,size=4GiB,load=1s,tps=50" --model "nomic-embed-text,size=0.3GiB,embed"

A real HTTP/1.1 server in its own process (trio + h11 through ``fakes.http11``) that copies
what a proxy in front of Ollama has to cope with (``shared/research/protocols.md`` section 2):

* native routes: ``POST /api/generate``, ``/api/chat`` (NDJSON streams by default,
  ``stream:false`` one JSON object; ``done:false`` lines then ``done:true`` with ``done_reason``
  and the nanosecond metrics), ``/api/embed``, legacy ``/api/embeddings``, ``POST /api/show``,
  ``GET /api/tags``, ``/api/ps``, ``/api/version``, ``GET|HEAD /`` ("Ollama is running");
* OpenAI compatibility: ``/v1/chat/completions``, ``/v1/completions``, ``/v1/embeddings``,
  ``/v1/models``, ``/v1/models/{name}``, with OpenAI's error envelope;
* ``POST /v1/responses`` (OpenAI Responses: one ``response`` object, or named SSE events
  ``response.created`` ... ``response.completed``; OpenAI's error envelope) and ``POST /v1/messages``
  (Anthropic Messages: one ``message``, or ``message_start`` ... ``message_stop``; Anthropic's
  ``{"type": "error", "error": {...}}``), both run through the chat handler like Ollama's middleware;
* the scheduler (``sched``): a model loads on first use (``load=`` time; listed in ``/api/ps``
  while loading), serves ``--num-parallel`` requests at once, expires ``keep_alive`` after its
  last request (default ``--keep-alive 5m``; ``0`` = at once; negative = never; a JSON number
  is seconds, a string a Go duration), stays in ``/api/ps`` for ``--unload-lag`` while it
  unloads; ``--max-loaded-models`` evicts idle models; ``--max-queue`` answers 503
  ``ErrMaxQueue`` when that many requests already wait;
* an empty prompt (``messages: []``) loads the model: ``done_reason:"load"``; with
  ``keep_alive:0`` it unloads it instead: ``done_reason:"unload"`` (also for embedding-only
  models, which otherwise answer generate/chat with 400 ``"<m>" does not support generate``);
* errors are ``{"error": "..."}``; a stream that fails after it started sends one more line
  ``{"error": "..."}`` (status stays 200) and ends (/v1/responses and /v1/messages streams just end);
* a client that goes away stops its generation (or its wait) at once;
* with ``--sim-gpu DIR`` the process registers the total size of the models it holds with
  ``fakes.simgpu`` (one process, several models), and unregisters on exit.

Deterministic "tokenizer" (shared with the fake llama-server): a prompt costs one token per
word; an answer is ``--num-predict`` tokens (``done_reason:"stop"``) unless ``num_predict`` /
``max_tokens`` cut it shorter (``"length"``); tokens cycle through a small vocabulary.

Test hook: a prompt containing ``FAKE_ERROR_MIDSTREAM`` fails after two tokens (a mid-stream
error line, or a 500 when not streaming).

``GET /fake/stats`` -> ``{"loaded": {name: state}, "memory", "requests_started",
"requests_completed", "requests_cancelled", "requests_rejected", "requests_failed", "waiting",
"active", "loads", "unloads", "unload_calls", "connections"}``.

SIGTERM/SIGINT -> exit 0 at once (memory unregistered). Startup is logged to stderr; one gin-style
line per request only with ``-v``.

Modules: ``cli`` (flags, model specs, Config), ``gotime`` (Go durations, keep_alive, timestamps),
``errors`` (the three error shapes), ``parsing`` (request bodies), ``sched`` (runners, keep_alive,
queue, memory), ``formats`` (response shapes), ``openai_responses`` and ``anthropic_messages``
(those two APIs: requests and answers), ``engine`` (generation, embeddings), ``server`` (routes, main).
"""

from fakes.ollama.cli import Config, ModelSpec, parse_config
from fakes.ollama.server import FakeOllama, main, run_server

__all__ = ["Config", "FakeOllama", "ModelSpec", "main", "parse_config", "run_server"]
