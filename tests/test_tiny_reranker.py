"""fakes.tiny_gguf's reranker: a tiny BERT with rank pooling and a classification head that the
REAL llama-server loads with ``--reranking`` and ranks documents with.

The binary comes from fakes.llama_binary; a missing one fails these tests, it never skips.
"""

from __future__ import annotations

import math
from pathlib import Path

import gguf
import httpx
import pytest

from fakes import tiny_gguf
from fakes.llama_binary import llama_server_path
from fakes.tiny_gguf import write_tiny_model
from tests.bare_llama import open_bare_llama_server

DOCUMENTS = ["a dog in the park", "a cat sat on the mat", "the stock market fell", "cats and dogs"]


def _tensors(path: Path) -> dict[str, list[int]]:
    return {t.name: [int(n) for n in t.shape] for t in gguf.GGUFReader(path).tensors}


def test_a_reranker_is_a_bert_with_rank_pooling_and_a_classification_head(tmp_path: Path) -> None:
    plain = write_tiny_model(tmp_path / "bert.gguf", "bert")
    ranker = write_tiny_model(tmp_path / "ranker.gguf", "bert", reranker=True)
    assert (ranker.reranker, ranker.pooling, plain.reranker) == (True, "rank", False)
    reader = gguf.GGUFReader(ranker.path)
    assert reader.fields["bert.pooling_type"].contents() == gguf.PoolingType.RANK
    head = {name: shape for name, shape in _tensors(ranker.path).items() if name.startswith("cls")}
    n = ranker.n_embd  # ggml order, ne0 first: one score per sequence
    assert head == {"cls.weight": [n, n], "cls.bias": [n], "cls.output.weight": [n, 1], "cls.output.bias": [1]}
    assert ranker.n_tensors == plain.n_tensors + 4 and ranker.tensor_bytes == plain.tensor_bytes + 4 * (n * n + 2 * n + 1)
    assert write_tiny_model(tmp_path / "same.gguf", "bert", pooling="rank").path.read_bytes() == ranker.path.read_bytes()
    assert tiny_gguf.main(["bert", str(tmp_path / "cli.gguf"), "--reranker"]) == 0
    assert (tmp_path / "cli.gguf").read_bytes() == ranker.path.read_bytes()


def test_only_bert_reranks(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="reranker applies to bert only"):
        write_tiny_model(tmp_path / "x.gguf", "llama", reranker=True)
    with pytest.raises(ValueError, match="a reranker pools with 'rank'"):
        write_tiny_model(tmp_path / "x.gguf", "bert", reranker=True, pooling="mean")


@pytest.mark.slow
def test_the_real_llama_server_ranks_with_it(tmp_path: Path) -> None:
    ranker = write_tiny_model(tmp_path / "ranker.gguf", "bert", reranker=True)
    body = {"model": "ranker", "query": "a cat", "documents": DOCUMENTS}
    with open_bare_llama_server(llama_server_path(), ranker.path, ["-c", "512", "--reranking"],
                                tmp_path / "rank.log") as base:
        answer = httpx.post(f"{base}/v1/rerank", json=body, timeout=60)
        assert answer.status_code == 200, answer.text
        ranked = answer.json()
        assert (ranked["model"], ranked["object"]) == ("ranker", "list")
        assert ranked["usage"]["prompt_tokens"] == ranked["usage"]["total_tokens"] > len(DOCUMENTS)
        results = ranked["results"]
        assert sorted(r["index"] for r in results) == list(range(len(DOCUMENTS)))
        scores = [r["relevance_score"] for r in results]
        assert scores == sorted(scores, reverse=True) and all(math.isfinite(s) for s in scores)
        assert len(set(scores)) == len(scores)  # the head tells the pairs apart
        # The same order again on every path and shape; the scores only to float rounding (batches differ).
        again = httpx.post(f"{base}/rerank", json=body, timeout=60).json()["results"]
        top = httpx.post(f"{base}/v1/reranking", json={**body, "top_n": 2}, timeout=60).json()["results"]
        tei = httpx.post(f"{base}/reranking", json={"query": "a cat", "texts": DOCUMENTS}, timeout=60).json()
        for other, label, count in ((again, "relevance_score", 4), (top, "relevance_score", 2), (tei, "score", 4)):
            assert [r["index"] for r in other] == [r["index"] for r in results[:count]]
            assert [r[label] for r in other] == pytest.approx(scores[:count], rel=1e-4)


@pytest.mark.slow
def test_embeddings_alone_do_not_rerank(tmp_path: Path) -> None:
    """Rank pooling in the file is not enough: llama-server serves /rerank only when told (--reranking)."""
    ranker = write_tiny_model(tmp_path / "ranker.gguf", "bert", reranker=True)
    with open_bare_llama_server(llama_server_path(), ranker.path, ["-c", "512", "--embeddings"],
                                tmp_path / "embed.log") as base:
        refused = httpx.post(f"{base}/v1/rerank", json={"query": "q", "documents": ["a"]}, timeout=60)
        assert refused.status_code == 501 and "--reranking" in refused.json()["error"]["message"]
