"""A fake llama.cpp ``llama-server`` for tests, demos and load tests.

Run it from the repository root::

    python -m fakes.llama_server --port 8080 [-m model.gguf] [llama-server flags] [fake flags]

It is a real HTTP/1.1 server in its own process (trio + h11 through ``fakes.http11``, no
framework) that copies the behaviour a proxy in front of llama-server has to cope with (see
``shared/research/protocols.md`` section 3):

* the port is bound *before* the "model" loads; until then every route answers 503
  ``unavailable_error`` ("Loading model");
* OpenAI ``/v1/chat/completions`` (also ``/chat/completions``), ``/v1/completions`` and
  ``/v1/embeddings``; like llama-server, ``/completion``, ``/completions``, ``/embedding``
  and ``/embeddings`` are its *native* (non-OpenAI) shapes; ``/v1/models``, ``/slots``,
  ``/props``, ``/metrics``, llama-server's error envelope;
* the routes llama-server converts to chat, with their own shapes and quirks: OpenAI's
  Responses (``/v1/responses``, named SSE events), Anthropic's Messages (``/v1/messages``),
  audio transcription (``/v1/audio/transcriptions``, 501 unless ``--mmproj``), and the
  token counters (``/v1/responses/input_tokens``, ``/v1/chat/completions/input_tokens``,
  ``/v1/messages/count_tokens``); rerank (``/v1/rerank`` and three more paths) with
  ``--reranking``. With ``--embeddings`` (or ``--reranking``) the fake is an encoder model:
  every generation fails with llama-server's "does not support logits computation" 500;
* a fixed number of slots with continuous batching; further requests wait, FIFO,
  inside the server ("deferred") instead of being rejected;
* a context overflow is a plain 400 JSON even for ``stream: true``;
* cpp-httplib's connection habits: ``Connection: close`` and a close after every
  response >= 400, a close after ``--keepalive-max`` requests, an idle close after
  ``--keepalive-timeout``;
* a client that goes away stops its generation at once and frees its slot.

Prompts cost what a real engine counts (``fakes.chat_tokens``, within 15 % of llama-server on
agents' requests): a chat is rendered by the fake model's chat template first
(``fakes/chatml_tools.jinja``: ChatML, a default system prompt, the tools' JSON schemas in the
system message). Generated tokens cycle through ``VOCAB``, each sent as " word": until the
budget (``max_tokens``, ``n_predict``) or the context runs out ("length"); without a budget the
model says ``--max-tokens-default`` words and ends with an end-of-generation token (finish
"stop"), which counts as a token and shows as nothing. Some answers are scripted the same way:
a transcript; a tool call when a chat offers tools and asks for one, and an answer about the
tool's result after it (``fakes.tool_reply``), in each API's shape.

Test hooks in the prompt text: ``FAKE_ERROR_MIDSTREAM`` sends an error event after two
tokens and ends the stream without ``[DONE]``; ``FAKE_CRASH`` aborts the process
(exit status 134) after two tokens; ``FAKE_SPLIT_UTF8`` makes the answer start with a
character split over two byte tokens, so the stream has no role chunk (llama-server sends
it only with a first token that is whole UTF-8; likewise a Messages stream then has no
``message_start`` and a Responses stream announces ``response.created`` with every token).
The error event of ``FAKE_ERROR_MIDSTREAM`` is framed as each route frames its errors.
``FAKE_ERROR_CONTINUING`` does the same only in a chat that continues a prefill (below);
``FAKE_STOP_AFTER_<n>`` makes a chat's model end its answer after its n-th token.

A chat whose last message is the assistant's is a prefill, continued as llama-server
continues it: the tokens go on where its words stopped, and (llama-server's quirk, seen on
0.3.36) the answer echoes it: the first content delta is the prefill and the first new token,
a whole answer's content starts with it.

``GET /fake/stats`` -> ``{"started","completed","cancelled","active","deferred","connections"}``:
requests that got a slot, that finished, that the client abandoned while generating,
that generate now, that wait for a slot, and TCP connections accepted. A request failed
by ``FAKE_ERROR_MIDSTREAM`` counts as started only.

Startup and shutdown are logged to stderr like llama.cpp; one line per request only with
``-v`` (a busy fake must not fill a stderr pipe nobody drains).

Modules: ``cli`` (flags, Config, the stderr log), ``errors`` (the error envelope),
``parsing`` (request bodies), ``slots`` (slot pool, stats), ``formats`` (response shapes and
their SSE framing), ``responses``, ``messages``, ``transcription``, ``rerank`` (one API each:
its request and its answer), ``engine`` (generation and encoder tasks on the slots),
``placement`` (where ``--memory`` goes on several simulated GPUs: ``CUDA_VISIBLE_DEVICES``,
``-dev``, ``-sm``, ``-ts``, ``-mg``), ``server`` (routes, loading, main).
"""

from fakes.llama_server.cli import Config, parse_config
from fakes.llama_server.server import FakeLlamaServer, main, run_server

__all__ = ["Config", "FakeLlamaServer", "main", "parse_config", "run_server"]
