"""The HTTP side: Quart-Trio apps under Hypercorn, with a lean ASGI path for inference.

``http/`` serves connections for every listener; ``relay/`` carries a granted request to its
engine and the answer back; ``openai/``, ``ollama/`` and ``comfy/`` are the listeners, one per
API family. The modules here are shared by all of them: the door (keys, usage rows), the
request's class, its route, the catalog of names, error shapes, and remote nodes.
"""
