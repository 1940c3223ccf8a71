"""The Ollama-compatible listener: Ollama's clients point here instead of at Ollama."""
