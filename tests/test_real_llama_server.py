"""Smoke test against a real llama.cpp llama-server (CPU), with a tiny random llama model.

The binary comes from fakes.llama_binary (STEWARD_LLAMA_SERVER, else the cache that
`sh deploy/build-llama-server.sh` fills); a missing binary fails this test, it never skips.
"""

from __future__ import annotations

import signal
import socket
import subprocess
import time
from pathlib import Path

import gguf
import httpx
import numpy as np
import pytest

from fakes.llama_binary import llama_server_path

pytestmark = pytest.mark.slow  # starts a real llama-server


def write_tiny_llama(path: Path, n_layer: int = 2, n_embd: int = 64, n_head: int = 4,
                     n_ff: int = 128, n_ctx: int = 256) -> None:
    """A minimal valid `llama` GGUF: SPM vocab (specials, 256 byte tokens, a few words), random f32."""
    words = ["▁", "▁a", "▁b", "▁hello", "▁world", "a", "b", "e", "h", "l", "o", "r", "w", "d"]
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + words
    types = [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL]
    types += [gguf.TokenType.BYTE] * 256 + [gguf.TokenType.NORMAL] * len(words)
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("steward-tiny-llama")
    w.add_context_length(n_ctx)
    w.add_embedding_length(n_embd)
    w.add_block_count(n_layer)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(n_embd // n_head)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores([0.0] * 259 + [-float(i) for i in range(len(words))])
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    rng = np.random.default_rng(0)

    def tensor(name: str, *shape: int) -> None:  # numpy shape: (rows, cols) = gguf (ne1, ne0)
        data = np.ones(shape, np.float32) if len(shape) == 1 else rng.normal(0, 0.02, shape)
        w.add_tensor(name, data.astype(np.float32))

    tensor("token_embd.weight", len(tokens), n_embd)
    tensor("output_norm.weight", n_embd)
    tensor("output.weight", len(tokens), n_embd)
    for i in range(n_layer):
        tensor(f"blk.{i}.attn_norm.weight", n_embd)
        for t in ("attn_q", "attn_k", "attn_v", "attn_output"):
            tensor(f"blk.{i}.{t}.weight", n_embd, n_embd)
        tensor(f"blk.{i}.ffn_norm.weight", n_embd)
        tensor(f"blk.{i}.ffn_gate.weight", n_ff, n_embd)
        tensor(f"blk.{i}.ffn_up.weight", n_ff, n_embd)
        tensor(f"blk.{i}.ffn_down.weight", n_embd, n_ff)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


def test_real_llama_server_loads_tiny_model_and_completes(tmp_path: Path) -> None:
    binary = llama_server_path()  # FileNotFoundError with the build command when missing
    model = tmp_path / "tiny-llama.gguf"
    write_tiny_llama(model)
    port = free_port()
    log_path = tmp_path / "llama-server.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [str(binary), "--model", str(model), "--host", "127.0.0.1", "--port", str(port),
             "--ctx-size", "256", "--parallel", "1", "--threads", "2"],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        status = None
        while status != 200:
            if proc.poll() is not None:
                pytest.fail(f"llama-server exited with {proc.returncode}:\n{log_path.read_text()[-4000:]}")
            if time.monotonic() > deadline:
                pytest.fail(f"/health not 200 after 60 s (last {status}):\n{log_path.read_text()[-4000:]}")
            try:
                status = httpx.get(url + "/health", timeout=2).status_code
            except httpx.TransportError:
                pass
            time.sleep(0.1)

        r = httpx.post(url + "/completion", json={"prompt": "hello world", "n_predict": 4}, timeout=30)
        assert r.status_code == 200, r.text
        body = r.json()
        assert isinstance(body["content"], str)
        assert body["tokens_predicted"] >= 1
        assert body["timings"]["prompt_n"] >= 1

        r = httpx.post(url + "/v1/chat/completions", timeout=30, json={
            "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4})
        assert r.status_code == 200, r.text
        choice = r.json()["choices"][0]
        assert choice["message"]["role"] == "assistant"
        assert r.json()["usage"]["completion_tokens"] >= 1
    finally:
        stop(proc)
    assert proc.returncode is not None
