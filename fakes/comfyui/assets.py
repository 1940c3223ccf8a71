"""Static answers and images: PNGs for /view, /object_info, the landing page.

``/object_info`` has two kinds of node. ComfyUI's weight-free image nodes (EmptyImage,
ImageInvert, SaveImage, PreviewImage) are copied from ComfyUI 0.3.64's own entries, and the fake
runs them: a `Picture` of the size and colour EmptyImage makes (ImageInvert inverting it, in
float32 as torch does) is what SaveImage saves and /view serves, pixel for pixel what ComfyUI
writes. One difference: SaveImage's ``filename_prefix`` is optional here (steward's demo and load
test workflows leave it out). The nodes that need weights (CheckpointLoaderSimple, KSampler, ...)
are stand-ins: the real input shapes (types, min/max), but every input optional, so that a short
workflow (a KSampler straight into SaveImage) runs; their module is a custom node's, as nothing
ComfyUI knows of its own nodes is true of them.
"""

from __future__ import annotations

import struct
import zlib
from typing import Any

import attrs

STAND_IN_MODULE = "custom_nodes.fakes_comfyui"


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)


def tiny_png(width: int = 1, height: int = 1, rgba: tuple[int, ...] = (255, 128, 0, 255)) -> bytes:
    """A valid PNG of one colour: RGBA, or RGB (as ComfyUI saves) for three channels."""
    colour_type = {3: 2, 4: 6}[len(rgba)]
    row = b"\x00" + bytes(rgba) * width
    packer = zlib.compressobj()
    data = b"".join(packer.compress(row) for _ in range(height)) + packer.flush()  # one row in memory at a time
    return (b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, colour_type, 0, 0, 0))
            + _chunk(b"IDAT", data) + _chunk(b"IEND", b""))


PNG = tiny_png()


def float32(value: float) -> float:
    """*value* rounded to a float32, as a torch tensor holds it."""
    return float(struct.unpack("f", struct.pack("f", value))[0])


@attrs.frozen
class Picture:
    """A batch of images of one colour: EmptyImage's tensor, channels as float32 in 0..1."""

    width: int
    height: int
    batch: int
    channels: tuple[float, float, float]

    @classmethod
    def empty(cls, width: int, height: int, batch: int, color: int) -> Picture:
        return cls(width, height, batch, (float32((color >> 16 & 0xFF) / 0xFF), float32((color >> 8 & 0xFF) / 0xFF),
                                          float32((color & 0xFF) / 0xFF)))

    def inverted(self) -> Picture:
        return attrs.evolve(self, channels=tuple(float32(1.0 - c) for c in self.channels))

    @property
    def rgb(self) -> tuple[int, int, int]:
        """SaveImage's pixel: ``clip(255. * image, 0, 255).astype(uint8)``, float32 and truncated."""
        r, g, b = (int(min(max(float32(255.0 * c), 0.0), 255.0)) for c in self.channels)
        return r, g, b

    def png(self) -> bytes:
        return tiny_png(self.width, self.height, self.rgb)

    def animated_webp(self, fps: float) -> bytes:
        """The batch as SaveAnimatedWEBP writes it (Pillow, as ComfyUI), frame *i* *i* shades redder."""
        import io

        from PIL import Image  # the test extra's: only a workflow with SaveAnimatedWEBP needs it

        r, g, b = self.rgb
        frames = [Image.new("RGB", (self.width, self.height), ((r + 8 * i) % 256, g, b)) for i in range(self.batch)]
        out = io.BytesIO()
        frames[0].save(out, "WEBP", save_all=True, append_images=frames[1:], duration=round(1000 / fps),
                       lossless=True, method=0)
        return out.getvalue()


INDEX_HTML = (b"<!DOCTYPE html><html><head><title>ComfyUI</title></head>"
              b"<body>fakes.comfyui: no frontend here; use the API.</body></html>")


def _node(name: str, inputs: dict[str, Any], outputs: list[str], category: str, *, output_node: bool = False,
          display: str = "", description: str = "", optional: dict[str, Any] | None = None,
          hidden: dict[str, str] | None = None, module: str = "nodes") -> dict[str, Any]:
    """An /object_info entry, its keys in ComfyUI's order."""
    spec = {"required": inputs, **({"optional": optional} if optional else {})}
    spec.update({"hidden": hidden} if hidden else {})
    return {"input": spec, "input_order": {key: list(value) for key, value in spec.items()}, "output": outputs,
            "output_is_list": [False] * len(outputs), "output_name": outputs, "name": name,
            "display_name": display or name, "description": description, "python_module": module,
            "category": category, "output_node": output_node}


def _stand_in(name: str, inputs: dict[str, Any], outputs: list[str], category: str, *,
              output_node: bool = False) -> dict[str, Any]:
    return _node(name, {}, outputs, category, output_node=output_node, optional=inputs, module=STAND_IN_MODULE)


_HIDDEN = {"prompt": "PROMPT", "extra_pnginfo": "EXTRA_PNGINFO"}
_SAVED = "Saves the input images to your ComfyUI output directory."
_PREFIX = ("The prefix for the file to save. This may include formatting information such as %date:yyyy-MM-dd% or "
           "%Empty Latent Image.width% to include values from nodes.")
_SIDE = {"default": 512, "min": 1, "max": 16384, "step": 1}
_LATENT_SIDE = {"default": 512, "min": 16, "max": 16384, "step": 8}


def object_info() -> dict[str, Any]:
    nodes = [
        # ComfyUI 0.3.64's own entries.
        _node("EmptyImage", {"width": ["INT", _SIDE], "height": ["INT", _SIDE],
                             "batch_size": ["INT", {"default": 1, "min": 1, "max": 4096}],
                             "color": ["INT", {"default": 0, "min": 0, "max": 0xFFFFFF, "step": 1,
                                               "display": "color"}]},
              ["IMAGE"], "image"),
        _node("ImageInvert", {"image": ["IMAGE"]}, ["IMAGE"], "image", display="Invert Image"),
        _node("SaveImage", {"images": ["IMAGE", {"tooltip": "The images to save."}]}, [], "image", output_node=True,
              display="Save Image", description=_SAVED,
              optional={"filename_prefix": ["STRING", {"default": "ComfyUI", "tooltip": _PREFIX}]}, hidden=_HIDDEN),
        _node("PreviewImage", {"images": ["IMAGE"]}, [], "image", output_node=True, display="Preview Image",
              description=_SAVED, hidden=_HIDDEN),
        # Stand-ins for the nodes that need weights.
        _stand_in("CheckpointLoaderSimple", {"ckpt_name": [["fake.safetensors"]]}, ["MODEL", "CLIP", "VAE"],
                  "loaders"),
        _stand_in("CLIPTextEncode", {"text": ["STRING", {"multiline": True, "dynamicPrompts": True}],
                                     "clip": ["CLIP"]}, ["CONDITIONING"], "conditioning"),
        _stand_in("EmptyLatentImage", {"width": ["INT", _LATENT_SIDE], "height": ["INT", _LATENT_SIDE],
                                       "batch_size": ["INT", {"default": 1, "min": 1, "max": 4096}]},
                  ["LATENT"], "latent"),
        _stand_in("KSampler", {
            "model": ["MODEL"], "seed": ["INT", {"default": 0, "min": 0, "max": 0xFFFFFFFFFFFFFFFF}],
            "steps": ["INT", {"default": 20, "min": 1, "max": 10000}],
            "cfg": ["FLOAT", {"default": 8.0, "min": 0.0, "max": 100.0, "step": 0.1, "round": 0.01}],
            "sampler_name": [["euler", "euler_ancestral", "dpmpp_2m"]], "scheduler": [["simple", "normal", "karras"]],
            "positive": ["CONDITIONING"], "negative": ["CONDITIONING"], "latent_image": ["LATENT"],
            "denoise": ["FLOAT", {"default": 1.0, "min": 0.0, "max": 1.0, "step": 0.01}]}, ["LATENT"], "sampling"),
        _stand_in("VAEDecode", {"samples": ["LATENT"], "vae": ["VAE"]}, ["IMAGE"], "latent"),
    ]
    info = {entry["name"]: entry for entry in nodes}
    # The fake's own test nodes and the other output classes it knows (workflow.py).
    from fakes.comfyui.workflow import ERROR_CLASS, INVALID_CLASS, OUTPUT_CLASSES

    for name in sorted(OUTPUT_CLASSES - set(info)):
        info[name] = _stand_in(name, {"images": ["IMAGE"]}, [], "image", output_node=True)
    info[INVALID_CLASS] = _stand_in(INVALID_CLASS, {"fake_input": [[]]}, ["IMAGE"], "testing")
    info[ERROR_CLASS] = _stand_in(ERROR_CLASS, {}, ["IMAGE"], "testing")
    return info
