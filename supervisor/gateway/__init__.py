"""The HTTP layer: a Quart-Trio app under Hypercorn, with a lean ASGI path for inference."""
