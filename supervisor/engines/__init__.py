"""The engines: each runtime's process started, watched, measured and stopped.

``driver`` is the one supervisor task per engine; ``process`` and ``process_tree`` own child
processes and read their trees from /proc; ``reaper`` kills steward's process groups if steward
dies; ``probes`` and ``simulated_gpu`` read what the device has; ``measurements`` and
``memory_plan`` say what each engine reserves; ``service`` and ``service_probe`` keep the
runtimes that stay up (Ollama, ComfyUI, a sleeping vLLM).
"""
