"""``steward top``: a live, full-screen view of a running steward for a tmux pane.

Everything it shows comes from steward's admin API: ``GET /admin/state`` (the whole
picture: memory per device by tier, the engines, the queues and why their heads wait, the
recent rejections and events) and ``GET /admin/events`` (the event log as it happens,
Server-Sent Events). Steward decides; top only reads and draws.

The parts, each small:

- ``view``: a pure function from one ``Frame`` (the state document, the recent events, what
  the person asked to see, the width and height) to a rich renderable. Every line is cut,
  never wrapped, so a long name cannot push the picture out of shape; tested as text.
- ``model``: what top knows and shows (``Top``), changed by plain method calls: a state
  fetched, an event seen, a fetch failed, a key pressed. No I/O, no clock.
- ``client``: the HTTP edge: fetch the state, follow the events; 401/403 and an unreachable
  steward become typed errors.
- ``keys``: the terminal in cbreak mode (restored on every way out) and its key presses.
- ``app``: the live loop (a nursery of the event follower, the state poller, the key reader
  and the drawer) and ``--once``.
- ``command``: the ``steward top`` subcommand's parser and entry (rich is imported only
  when top runs, so other commands do not pay for it).
"""
