"""A fake ComfyUI server for tests and demos of whatever sits in front of ComfyUI.

Run it from the repository root::

    python -m fakes.comfyui --port 8188 [--sim-gpu DIR] [--vram 16GiB] [--job-time 2s] \\
        [--model-memory 6GiB] [--load-time 0s] [--free-delay 0.5s] [--steps 4] [-v]

A real HTTP/1.1 + websocket server in its own process (trio + h11 + wsproto through
``fakes.http11``) that copies what a proxy in front of ComfyUI has to cope with
(``shared/research/protocols.md`` section 1):

* ``POST /prompt`` -> ``{prompt_id, number, node_errors}``, or 400 ``no_prompt`` /
  ``invalid_prompt`` / ``prompt_no_outputs`` / ``prompt_outputs_failed_validation`` (a node of
  class ``FAKE_INVALID``, or inputs ComfyUI's validation refuses: a required one missing, an
  INT/FLOAT that does not convert or is out of min/max, on the nodes that carry ComfyUI's real
  specs: ``EmptyImage``, ``ImageInvert``, ``SaveImage``, ``PreviewImage``); a body that is not
  JSON -> 500, as aiohttp does;
* one prompt at a time, lowest ``number`` first (``front`` jumps the queue), each running
  ``--job-time`` (a node input ``fake_seconds`` overrides it); a ``FAKE_ERROR`` node fails it;
* the first job "loads the models": ``--model-memory`` is held (registered with the simulated
  GPU) and stays after the job, like ComfyUI's model cache, until ``POST /free`` with
  ``unload_models``/``free_memory`` (200 at once, memory dropped ``--free-delay`` later, after
  the running prompt if there is one); ``--disable-smart-memory`` unloads after every prompt;
* ``GET|POST /queue`` (``clear``, ``delete``), ``POST /interrupt`` (optionally one
  ``prompt_id``; the prompt ends with ``execution_interrupted``, history status error),
  ``GET /history``, ``/history/{id}`` (``{}`` until done), ``POST /history``, ``GET /prompt``,
  ``/system_stats`` (``devices[0].vram_total/vram_free`` in bytes, from the simulated GPU if
  given), ``/features``, ``/object_info`` (small), ``/view`` (the PNG a SaveImage wrote: the size and
  colour of its EmptyImage/ImageInvert chain, else a tiny one), ``/embeddings``, ``/extensions``;
* websocket ``/ws?clientId=ID``: ``status`` with ``sid`` first; ``status`` to everyone whenever the
  queue changes (a prompt queued, taken, finished, deleted); per prompt of that client
  ``execution_start``, ``execution_cached``, ``executing`` per node, ``progress`` (value/max),
  ``executed`` for outputs, ``execution_success`` (or ``execution_error`` /
  ``execution_interrupted``), ``status``, and ``executing`` with ``node: null``. A prompt without
  ``client_id`` sends only ``progress`` and ``execution_interrupted``, to every socket. Pings are
  answered; ``feature_flags`` is answered. Text frames only (no binary previews);
* every route also under ``/api``; ComfyUI's Origin middleware: a loopback ``Host`` with an
  ``Origin`` naming another host -> 403 with an empty body (``--enable-cors-header`` turns it
  off and adds CORS headers); ``OPTIONS`` -> 200;
* aiohttp's mutation answers: 200 with an empty body.

Test hooks: ``POST /fake/drop`` (``{"prompt_id"}``, or everything without one) makes a queued or
running prompt vanish without a history entry or any further message; ``POST /fake/restart``
does what a restart looks like from outside (queue, history, websockets and memory gone).
``GET /fake/stats`` -> counters (prompts queued/succeeded/failed/interrupted/dropped,
free_calls, loads, unloads, memory, pending, running, ws_clients, connections).

SIGTERM/SIGINT -> exit 0 (memory unregistered).

Modules: ``cli`` (flags, Config), ``workflow`` (validation, the execution plan), ``memory``
(the model cache on the GPU), ``ws`` (websocket clients), ``prompts`` (queue, history, worker),
``assets`` (PNG, object_info), ``server`` (routes, Origin check, main).
"""

from fakes.comfyui.cli import Config, parse_config
from fakes.comfyui.server import FakeComfyUI, main, run_server

__all__ = ["Config", "FakeComfyUI", "main", "parse_config", "run_server"]
