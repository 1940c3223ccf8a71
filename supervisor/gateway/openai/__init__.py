"""The OpenAI-compatible listener: chat, completions, responses, messages, embeddings, images,
audio, and the model list, in the OpenAI (and Anthropic Messages) shapes."""
