"""Control from the seat: ``steward ps`` and ``steward load|unload|pin|unpin NAME``, as
``ollama ps`` and ``ollama stop`` are for Ollama.

They use steward's admin API like ``steward top`` (its URL from ``--url``, else the listen
address of ``--config``; its key from ``--key``, else ``$STEWARD_KEY``; the same refusals):
``GET /admin/state`` for the engines, ``POST /admin/engines/NAME/ACTION`` for an action,
through the scheduler and its rules. Steward decides; these only ask and say the answer.

- ``command``: the subcommands' parsers and entry (httpx is imported only when one runs).
- ``calls``: the requests, and the wait for a load or an unload to be done.
- ``table``: the engines as ``steward ps`` prints them (pure).
"""
