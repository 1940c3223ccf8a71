"""Managed services: runtimes that stay up and hold models themselves (Ollama, ComfyUI)."""
