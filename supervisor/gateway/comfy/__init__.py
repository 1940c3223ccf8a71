"""The ComfyUI-compatible listener and ComfyUI's API as steward reads and calls it."""
