"""Several hosts: the front door's view of its nodes (state, routing, waking)."""
