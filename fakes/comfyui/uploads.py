"""ComfyUI's upload forms, read with werkzeug's form parser as aiohttp's would read them."""

from __future__ import annotations

import io

from werkzeug.datastructures import FileStorage
from werkzeug.formparser import parse_form_data

from fakes.http11 import Request


def parse_upload(request: Request) -> tuple[dict[str, str], dict[str, FileStorage]]:
    """The form's text fields and its files; ValueError for a body that is no multipart form."""
    environ = {"REQUEST_METHOD": "POST", "CONTENT_TYPE": request.headers.get("content-type", ""),
               "CONTENT_LENGTH": str(len(request.body)), "wsgi.input": io.BytesIO(request.body)}
    _, form, files = parse_form_data(environ, max_form_memory_size=None, silent=False)
    return dict(form.items()), dict(files.items())
