"""multipart/form-data bodies (audio transcriptions): read to route them, rewritten only when steward must.

Steward reads a form for its ``model`` field (and steward's own ``steward`` field), with
werkzeug's multipart parser; the body goes to the engine byte for byte unless a field had
to change (a class suffix removed, the engine's own name for the model), and then it is
written again with werkzeug's encoder and the client's boundary.
"""

from __future__ import annotations

import attrs
from werkzeug.datastructures import Headers
from werkzeug.exceptions import RequestEntityTooLarge
from werkzeug.http import parse_options_header
from werkzeug.sansio.multipart import Data, Epilogue, Field, File, MultipartDecoder, MultipartEncoder, NeedData

from supervisor.gateway.http.asgi import RequestError

MAX_PARTS = 1000  # a form of many tiny parts is an attack on the parser, not a transcription


@attrs.frozen
class Part:
    name: str
    filename: str | None
    headers: Headers
    data: bytes


@attrs.frozen
class Form:
    boundary: bytes
    parts: tuple[Part, ...]

    def value(self, name: str) -> str | None:
        """The first field *name* as text (None if absent, or if it is a file)."""
        for part in self.parts:
            if part.name == name and part.filename is None:
                return part.data.decode("utf-8", errors="replace")
        return None

    def changed(self, values: dict[str, str | None]) -> Form:
        """The form with each named field set to its value, or removed where the value is None."""
        parts = []
        for part in self.parts:
            if part.name in values and part.filename is None:
                value = values[part.name]
                if value is not None:
                    parts.append(attrs.evolve(part, data=value.encode()))
            else:
                parts.append(part)
        return attrs.evolve(self, parts=tuple(parts))

    def encode(self) -> bytes:
        encoder = MultipartEncoder(self.boundary)
        out = [encoder.send_event(File(part.name, part.filename, part.headers) if part.filename is not None
                                  else Field(part.name, part.headers))
               + encoder.send_event(Data(part.data, more_data=False)) for part in self.parts]
        out.append(encoder.send_event(Epilogue(b"")))
        return b"".join(out)


def parse_form(content_type: str | None, body: bytes) -> Form:
    """The parts of a multipart/form-data body; RequestError(400) for anything else."""
    kind, options = parse_options_header(content_type or "")
    if kind != "multipart/form-data" or not options.get("boundary"):
        raise RequestError(400, "This route takes a multipart/form-data body (Content-Type: multipart/form-data; "
                                "boundary=...), like OpenAI's audio transcriptions.")
    boundary = options["boundary"].encode("latin-1")
    decoder = MultipartDecoder(boundary, max_parts=MAX_PARTS)
    parts: list[Part] = []
    try:
        decoder.receive_data(body)
        decoder.receive_data(None)
        current: tuple[str, str | None, Headers] | None = None
        data: list[bytes] = []
        while not isinstance(event := decoder.next_event(), (Epilogue, NeedData)):
            if isinstance(event, (Field, File)):
                current = (event.name, event.filename if isinstance(event, File) else None, event.headers)
                data = []
            elif isinstance(event, Data) and current is not None:
                data.append(event.data)
                if not event.more_data:
                    parts.append(Part(*current, b"".join(data)))
                    current = None
    except RequestEntityTooLarge:  # werkzeug's word for more than max_parts
        raise RequestError(413, f"The multipart body has more than {MAX_PARTS} parts.",
                           code="request_too_large") from None
    except ValueError as exc:  # werkzeug's word for a malformed form
        raise RequestError(400, f"The multipart body could not be read: it is cut short or malformed ({exc}).") \
            from None
    if isinstance(event, NeedData):
        raise RequestError(400, "The multipart body ends before its closing boundary.")
    return Form(boundary, tuple(parts))
