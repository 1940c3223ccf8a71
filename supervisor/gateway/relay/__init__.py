"""Relaying a granted request to its engine and the answer back: the upstream client, the
readers an answer passes (usage, model name, stream errors, openings), steps and embeddings."""
