"""A webhook's side of an HTTP POST, for the stand-ins of an ntfy server (tests, the overload scenario).

h11 over a trio stream: each request read whole, with its headers by lower-case name, so a
test can check what steward's alerter sent exactly as a receiver would see it.
"""

from __future__ import annotations

import attrs
import h11
import trio


@attrs.frozen
class Received:
    target: str
    headers: dict[str, str]  # lower-case names
    body: str


async def read_request(connection: h11.Connection, stream: trio.SocketStream) -> Received | None:
    """The next whole request on *connection*, or None once the client closed it."""
    request, body = None, b""
    while True:
        event = connection.next_event()
        if event is h11.NEED_DATA:
            connection.receive_data(await stream.receive_some(65536))
        elif isinstance(event, h11.Request):
            request = event
        elif isinstance(event, h11.Data):
            body += event.data
        elif isinstance(event, h11.EndOfMessage) and request is not None:
            headers = {name.decode("latin-1").lower(): value.decode("latin-1") for name, value in request.headers}
            return Received(request.target.decode("latin-1"), headers, body.decode("utf-8", "replace"))
        else:
            return None  # the connection closed
