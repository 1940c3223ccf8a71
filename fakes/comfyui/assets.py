"""Static answers: a tiny PNG for /view, a small /object_info, the landing page."""

from __future__ import annotations

import struct
import zlib
from typing import Any


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)


def tiny_png(width: int = 1, height: int = 1, rgba: tuple[int, int, int, int] = (255, 128, 0, 255)) -> bytes:
    """A valid RGBA PNG of one colour."""
    rows = b"".join(b"\x00" + bytes(rgba) * width for _ in range(height))
    return (b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 6, 0, 0, 0))
            + _chunk(b"IDAT", zlib.compress(rows)) + _chunk(b"IEND", b""))


PNG = tiny_png()

INDEX_HTML = (b"<!DOCTYPE html><html><head><title>ComfyUI</title></head>"
              b"<body>fakes.comfyui: no frontend here; use the API.</body></html>")


def _node(inputs: dict[str, Any], outputs: list[str], category: str, *, output_node: bool = False,
          display: str = "") -> dict[str, Any]:
    return {"input": {"required": inputs}, "input_order": {"required": list(inputs)}, "output": outputs,
            "output_is_list": [False] * len(outputs), "output_name": outputs, "display_name": display,
            "description": "", "python_module": "nodes", "category": category, "output_node": output_node}


def object_info() -> dict[str, Any]:
    info = {
        "CheckpointLoaderSimple": _node({"ckpt_name": [["fake.safetensors"]]}, ["MODEL", "CLIP", "VAE"], "loaders"),
        "CLIPTextEncode": _node({"text": ["STRING", {"multiline": True}], "clip": ["CLIP"]}, ["CONDITIONING"],
                                "conditioning"),
        "EmptyLatentImage": _node({"width": ["INT", {"default": 512}], "height": ["INT", {"default": 512}],
                                   "batch_size": ["INT", {"default": 1}]}, ["LATENT"], "latent"),
        "KSampler": _node({"model": ["MODEL"], "seed": ["INT", {"default": 0}], "steps": ["INT", {"default": 20}],
                           "cfg": ["FLOAT", {"default": 8.0}], "positive": ["CONDITIONING"],
                           "negative": ["CONDITIONING"], "latent_image": ["LATENT"]}, ["LATENT"], "sampling"),
        "VAEDecode": _node({"samples": ["LATENT"], "vae": ["VAE"]}, ["IMAGE"], "latent"),
        "SaveImage": _node({"images": ["IMAGE"], "filename_prefix": ["STRING", {"default": "ComfyUI"}]}, [],
                           "image", output_node=True),
        "PreviewImage": _node({"images": ["IMAGE"]}, [], "image", output_node=True),
    }
    # The fake's own test nodes and the other output classes it knows (workflow.py).
    from fakes.comfyui.workflow import ERROR_CLASS, INVALID_CLASS, OUTPUT_CLASSES

    for name in OUTPUT_CLASSES - set(info):
        info[name] = _node({"images": ["IMAGE"]}, [], "image", output_node=True)
    info[INVALID_CLASS] = _node({"fake_input": [[]]}, ["IMAGE"], "testing")
    info[ERROR_CLASS] = _node({}, ["IMAGE"], "testing")
    for name, entry in info.items():
        entry["name"], entry["display_name"] = name, entry["display_name"] or name
    return info
