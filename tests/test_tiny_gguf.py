"""fakes.tiny_gguf: each tiny architecture reads back with gguf and loads + answers in the REAL llama-server.

The binary comes from fakes.llama_binary (STEWARD_LLAMA_SERVER, else the cache that
`sh deploy/build-llama-server.sh` fills); a missing binary fails these tests, it never skips.
Each server's combined output is kept in $TMPDIR/tiny-gguf-<arch>.log for reading sizes off.
"""

from __future__ import annotations

import re
import tempfile
from pathlib import Path

import gguf
import httpx
import pytest

from fakes import tiny_gguf
from fakes.llama_binary import llama_server_path
from fakes.tiny_gguf import ARCHITECTURES, TinyModel, write_tiny_model
from tests.bare_llama import open_bare_llama_server

SERVER_ARGS = ["-c", "1024", "-np", "1", "-lv", "4"]  # -lv 4: llama.cpp's own load log (buffer sizes)


def _field(reader: gguf.GGUFReader, key: str):
    return reader.fields[key].contents()


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_file_reads_back(arch: str, tmp_path: Path) -> None:
    model = write_tiny_model(tmp_path / f"{arch}.gguf", arch)
    assert model.path.stat().st_size < 6 * 1024 * 1024
    reader = gguf.GGUFReader(model.path)
    assert _field(reader, "general.architecture") == arch
    assert _field(reader, f"{arch}.block_count") == model.n_layer
    assert _field(reader, f"{arch}.embedding_length") == model.n_embd
    assert len(_field(reader, "tokenizer.ggml.tokens")) == model.n_vocab

    names = {t.name for t in reader.tensors}
    assert len(reader.tensors) == model.n_tensors
    assert sum(int(t.n_bytes) for t in reader.tensors) == model.tensor_bytes
    assert "token_embd.weight" in names
    assert ("output.weight" in names) == (not model.tied_output)
    for il in range(model.n_layer):
        assert f"blk.{il}.ffn_up.weight" in names or f"blk.{il}.ffn_up_exps.weight" in names
    for il in model.attention_layers:
        assert {f"blk.{il}.attn_q.weight", f"blk.{il}.attn_k.weight", f"blk.{il}.attn_v.weight"} <= names
        k = next(t for t in reader.tensors if t.name == f"blk.{il}.attn_k.weight")
        assert list(k.shape) == [model.n_embd, model.n_embd_k_gqa(il)]  # ggml order
    for il in model.recurrent_layers:
        assert f"blk.{il}.shortconv.conv.weight" in names or f"blk.{il}.ssm_conv1d.weight" in names
    if model.n_expert:
        gate = next(t for t in reader.tensors if t.name == "blk.0.ffn_gate_exps.weight")
        assert list(gate.shape) == [model.n_embd, model.n_ff_exp, model.n_expert]
        assert _field(reader, f"{arch}.expert_used_count") == model.n_expert_used


def test_model_shapes() -> None:
    """The architectures exercise what the estimator must handle."""
    with tempfile.TemporaryDirectory() as tmp:
        m = {a: write_tiny_model(Path(tmp) / f"{a}.gguf", a) for a in ARCHITECTURES}
    assert m["llama"].n_head != m["llama"].n_head_kv[0] and m["llama"].weight_type == "q8_0"
    assert any(m["gemma3"].swa_layers) and not all(m["gemma3"].swa_layers)
    assert m["gemma3"].head_dim_k * m["gemma3"].n_head != m["gemma3"].n_embd
    assert m["qwen3moe"].n_expert > m["qwen3moe"].n_expert_used > 0
    for hybrid in ("lfm2", "granitehybrid"):
        assert m[hybrid].recurrent_layers and m[hybrid].attention_layers
    assert not m["bert"].causal and m["bert"].pooling == "mean" and m["bert"].kv_layers == ()
    assert len(m["gemma3n"].kv_layers) == 20 < m["gemma3n"].n_layer


def test_deterministic_and_overridable(tmp_path: Path) -> None:
    a = write_tiny_model(tmp_path / "a.gguf", "qwen3moe", seed=3)
    b = write_tiny_model(tmp_path / "b.gguf", "qwen3moe", seed=3)
    c = write_tiny_model(tmp_path / "c.gguf", "qwen3moe", seed=4)
    assert a.path.read_bytes() == b.path.read_bytes() != c.path.read_bytes()
    d = write_tiny_model(tmp_path / "d.gguf", "granitehybrid", n_layer=6, attention_layers=[0, 5])
    assert d.n_head_kv == (2, 0, 0, 0, 0, 2) and d.recurrent_layers == (1, 2, 3, 4)
    e = write_tiny_model(tmp_path / "e.gguf", "gemma3", n_layer=4, swa_pattern=2)
    assert e.swa_layers == (True, False, True, False)
    assert _field(gguf.GGUFReader(e.path), "gemma3.attention.sliding_window_pattern") == 2
    with pytest.raises(TypeError, match="n_layers"):
        write_tiny_model(tmp_path / "f.gguf", "llama", n_layers=3)


def test_cli(tmp_path: Path) -> None:
    out = tmp_path / "cli.gguf"
    assert tiny_gguf.main(["lfm2", str(out), "--layers", "6", "--seed", "2"]) == 0
    reader = gguf.GGUFReader(out)
    assert _field(reader, "lfm2.block_count") == 6
    assert list(_field(reader, "lfm2.attention.head_count_kv")) == [0, 2, 0, 2, 0, 2]


# ---------------------------------------------------------------------------------------------
# the real llama-server


def _ask(model: TinyModel, base: str) -> None:
    if not model.causal:
        r = httpx.post(f"{base}/v1/embeddings", json={"input": ["hello world", "tiny model"]}, timeout=60)
        assert r.status_code == 200, r.text
        data = r.json()["data"]
        assert len(data) == 2 and all(len(d["embedding"]) == model.n_embd for d in data)
        return
    r = httpx.post(f"{base}/v1/chat/completions", timeout=60, json={
        "messages": [{"role": "user", "content": "hello there"}], "max_tokens": 4, "temperature": 0})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["choices"][0]["message"]["role"] == "assistant"
    assert 1 <= body["usage"]["completion_tokens"] <= 4
    r = httpx.post(f"{base}/completion", timeout=60, json={"prompt": "the tiny", "n_predict": 3})
    assert r.status_code == 200, r.text
    assert r.json()["tokens_predicted"] >= 1


_KV_SIZE = re.compile(r"^llama_kv_cache: size =.*\(\s*(\d+) cells,\s+(\d+) layers", re.M)


def _check_memory_log(model: TinyModel, text: str) -> None:
    """The load log matches the record: buffers present, one KV layer per layer that owns KV.

    (`llama_memory_recurrent: size = ... L layers` counts every layer of the model, so only the
    presence of the recurrent-state buffer is checked.)
    """
    text = re.sub(r"^[\d.]+ [IWE] ", "", text, flags=re.M)  # the server's timestamp/level prefix
    assert "load_tensors:   CPU_Mapped model buffer size" in text
    assert "compute buffer size" in text and "output buffer size" in text
    kv = [(int(cells), int(layers)) for cells, layers in _KV_SIZE.findall(text)]
    assert sum(layers for _, layers in kv) == len(model.kv_layers), kv
    assert ("RS buffer size" in text) == bool(model.recurrent_layers)
    if any(model.swa_layers):
        assert "creating     SWA KV cache" in text


@pytest.mark.slow
@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_real_llama_server_loads_and_answers(arch: str, tmp_path: Path) -> None:
    try:
        binary = llama_server_path()
    except FileNotFoundError as exc:
        pytest.fail(str(exc))
    model = write_tiny_model(tmp_path / f"{arch}.gguf", arch)
    log = Path(tempfile.gettempdir()) / f"tiny-gguf-{arch}.log"
    args = [*SERVER_ARGS, *([] if model.causal else ["--embeddings"])]
    with open_bare_llama_server(binary, model.path, args, log) as base:
        _ask(model, base)
    _check_memory_log(model, log.read_text(errors="replace"))
