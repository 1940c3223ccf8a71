"""A fake of vLLM's OpenAI-compatible server (0.32), an always-on engine, for tests and the demo.

Run it from the repository root::

    python -m fakes.openai_server --host 127.0.0.1 --port 8000 --served-model-name NAME [vLLM flags] [fake flags]

A real HTTP/1.1 server in its own process (trio + h11 through ``fakes.http11``) that copies
what a supervisor in front of vLLM has to cope with (``shared/research/real_runtimes.md``):

* the port is bound at start but listened on only once the engine is up (``--start-delay``):
  until then connections are refused; ``/health`` is then 200 with an empty body;
* ``/v1/models``, ``/v1/chat/completions``, ``/v1/completions`` (JSON or SSE ending
  ``data: [DONE]``, a usage chunk with ``stream_options.include_usage``), vLLM's error
  envelope (404 ``NotFoundError`` for an unknown model, 400 ``BadRequestError``), FastAPI's
  ``{"detail": "Not Found"}`` for unknown paths, ``/version``, ``/ping``;
* Anthropic's ``/v1/messages`` (JSON, or SSE events each with an ``event:`` line, one
  ``content_block_delta`` per token, ending ``message_stop``) and ``/v1/messages/count_tokens``,
  with vLLM 0.32's errors there (``messages``);
* at most ``--max-num-seqs`` requests generate at once, the rest wait inside the engine;
* ``/metrics`` with vLLM's families (labels ``model_name`` and ``engine="0"``) plus the
  fake's peak gauges ``fake:max_num_requests_running`` / ``fake:max_num_requests_waiting``;
  ``vllm:kv_cache_usage_perc`` is the running requests' KV blocks (one per ``--block-size``
  tokens begun) over the cache's (``--num-gpu-blocks-override``, else room for
  ``--max-num-seqs`` sequences of ``--max-model-len``);
* with ``VLLM_SERVER_DEV_MODE=1``: ``POST /sleep?level=N``, ``POST /wake_up[?tags=...]``,
  ``GET /is_sleeping`` (404 without it). Asleep, ``/health`` stays 200 and requests are held
  until wake-up; unlike the CPU build, sleep really frees the simulated GPU memory;
* ``--memory-in-child``: the memory is held by an engine-core child process (as vLLM's is),
  which dies with the server;
* faults: ``--fail-health-after N``, ``--crash-after-requests N``, ``--hang-after-requests N``
  (each counts what was served before: the (N+1)-th fails), ``--wake-fails``;
* uvicorn's start lines and access log on stderr; SIGTERM exits 0 at once.

Deterministic "tokenizer": one token per word (+4 per chat message, +3 for the assistant
turn); generated tokens cycle through ``formats.VOCAB``, one per SSE chunk.

``GET /fake/stats`` -> ``{"started", "running", "waiting", "max_running", "max_waiting",
"sleep_level", "held_bytes", "holder_pid"}``.

Modules: ``cli`` (flags, Config, the log), ``errors`` (error shapes), ``parsing`` (request
bodies), ``formats`` (response shapes), ``messages`` (Anthropic's Messages API: its bodies
and shapes), ``memory`` (what is held, and by whom), ``engine_core`` (the child's main),
``engine`` (scheduling, sleep, faults), ``metrics`` (Prometheus text), ``reply`` (uvicorn's
habits), ``server`` (routes, start, main).
"""

from fakes.openai_server.cli import Config, parse_config
from fakes.openai_server.server import FakeVllm, main, run_server

__all__ = ["Config", "FakeVllm", "main", "parse_config", "run_server"]
