"""Reranking (``/v1/rerank``, ``/v1/reranking``, ``/rerank``, ``/reranking``) the way llama-server serves it.

Only an embedding server that pools by rank serves it (``--reranking``, or ``--embeddings
--pooling rank``); any other answers 501 before reading the body. Two request shapes:
Jina's (``query``, ``documents``, ``top_n``), answered ``{"model", "object": "list", "usage":
{"prompt_tokens", "total_tokens"}, "results": [{"index", "relevance_score"}]}``, and TEI's
(``texts`` instead of ``documents``, ``return_text``), answered with the bare results array,
each with ``score`` (and ``text``). Results come sorted by descending score, cut to
``top_n``; ``model`` echoes the request's when it is a string. ``return_documents`` is
ignored, as llama-server ignores it. A negative ``top_n`` is the 500 that llama-server's
``std::vector::resize`` throws.

The fake's score: the share of the query's words that the document holds, plus a jitter
under 0.001 seeded by a hash of both texts, so ties break the same way every time. A pair
costs its words + 2 tokens ([CLS] query [SEP] document).
"""

from __future__ import annotations

import hashlib
import math
from typing import Any

import attrs

from fakes.chat_tokens import count_tokens
from fakes.llama_server.errors import invalid_request, server_error

JITTER = 1e-3


@attrs.frozen
class RerankRequest:
    query: str
    documents: tuple[str, ...]
    tei: bool            # TEI's shape (the body has "texts"): a bare array of {"index", "score"}
    top_n: int
    return_text: bool    # TEI only: each result carries its text
    model: str | None    # echoed in the answer when given

    @property
    def pair_tokens(self) -> list[int]:
        return [count_tokens(self.query) + count_tokens(doc) + 2 for doc in self.documents]


def rerank_request(body: dict[str, Any]) -> RerankRequest:
    if "query" not in body:
        raise invalid_request('"query" must be provided')
    query = body["query"]
    if not isinstance(query, str):
        raise invalid_request('"query" must be a string')
    # "documents" wins; one that is not a list of strings falls back to "texts".
    documents = _strings(body.get("documents"))
    if documents is None:
        documents = _strings(body.get("texts")) or ()
    if not documents:
        raise invalid_request('"documents" must be a non-empty string array')
    top_n = body.get("top_n")
    top_n = int(top_n) if isinstance(top_n, int | float) and math.isfinite(top_n) else len(documents)
    if top_n < 0:
        raise server_error("vector::_M_default_append")
    tei = "texts" in body
    model = body.get("model")
    return RerankRequest(query, documents, tei, top_n, tei and body.get("return_text") is True,
                         model if isinstance(model, str) else None)


def _strings(value: object) -> tuple[str, ...] | None:
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return tuple(value)
    return None


def relevance(query: str, document: str) -> float:
    """How well *document* answers *query*: the share of query words it holds, plus a fixed jitter."""
    words = set(query.lower().split())
    shared = len(words & set(document.lower().split())) / len(words) if words else 0.0
    digest = hashlib.sha256(f"{query}\0{document}".encode()).digest()
    return shared + JITTER * int.from_bytes(digest[:4], "big") / 2**32


def rerank_body(request: RerankRequest, model_id: str) -> object:
    label = "score" if request.tei else "relevance_score"
    results = []
    for index, document in enumerate(request.documents):
        result: dict[str, Any] = {"index": index, label: relevance(request.query, document)}
        if request.return_text:
            result["text"] = document
        results.append(result)
    results.sort(key=lambda r: r[label], reverse=True)
    results = results[:request.top_n]
    if request.tei:
        return results
    n_tokens = sum(request.pair_tokens)
    return {"model": request.model or model_id, "object": "list",
            "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens}, "results": results}
