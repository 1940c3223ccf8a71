"""The HTTP server layer every listener shares: connections, ASGI plumbing, the gate, browsers."""
