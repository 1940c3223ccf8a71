"""A tiny random-weight Llama in the Hugging Face layout, for tests against the real vLLM.

Nothing is downloaded: the model is a `transformers` `LlamaConfig` (hidden 64, 2 layers,
2 heads, fp32, tied embeddings, context 512) with seeded random weights, saved as
safetensors, and a byte-level BPE tokenizer (vocabulary 512) trained here with the
`tokenizers` library on text this module makes up, wrapped in `PreTrainedTokenizerFast`
with a chat template. About 500 KB; the same bytes on every run with the same packages.

torch, transformers and tokenizers exist only in the vLLM venv (fakes/vllm_env.py), so the
writing runs there, as a script:

    VLLM_PYTHON -m fakes.tiny_hf OUT_DIR        # cwd = the repository root

and the project side calls write_tiny_model(), which runs that and keeps the result in the
cache (TINY_MODEL_DIR under fakes.llama_binary.cache_root()) for later runs.

The embedding rows of the special tokens (bos, eos, the role markers) are zero, so their
logits are always 0 while the largest of the others is above 0: greedy decoding
(temperature 0) never stops early nor emits a special token (which the server strips from
the text), and a reply has exactly max_tokens tokens of visible text. (Left random, the
tied embeddings make greedy decoding repeat the prompt's last token, `<|assistant|>`.)
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

from fakes.llama_binary import cache_root
from fakes.vllm_env import vllm_python

# Bump the suffix when what is written changes, so that no cache keeps an old model.
TINY_MODEL_DIR = "tiny-hf-llama-v1"
SEED = 1234
VOCAB_SIZE = 512
CONTEXT = 512
BOS, EOS = "<s>", "</s>"
ROLES = ("system", "user", "assistant")
# Role markers are special tokens, so a chat prompt tokenizes the same way however the
# BPE merges fell.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}<|{{ message['role'] }}|>{{ message['content'] }}{{ eos_token }}{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
# The files a complete model directory holds (save_pretrained writes a few more).
MODEL_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")
WRITE_TIMEOUT_S = 300.0
ROOT = Path(__file__).resolve().parent.parent

_WORDS = (
    "the a model server answers requests tokens memory engine load unload stream chat "
    "completion health metrics queue running waiting sleep wake gpu cpu host port process "
    "group signal child parent reply prompt user assistant system hello world quick brown "
    "fox jumps over lazy dog one two three four five six seven eight nine ten and or not "
    "is are was were be has have had do does did will would can could should may might"
).split()


def cached_tiny_model() -> Path:
    return cache_root() / TINY_MODEL_DIR


def is_complete(model_dir: Path) -> bool:
    return all((model_dir / name).is_file() for name in MODEL_FILES)


def write_tiny_model(dest: Path | None = None) -> Path:
    """The tiny model's directory (default: the cache), written by the vLLM venv's python if not there yet.

    Raises FileNotFoundError (saying how to install it) when the vLLM venv is missing, and
    RuntimeError with the writer's output when writing fails. Concurrent callers are safe:
    each writes into its own temporary directory, and the first rename wins.
    """
    dest = cached_tiny_model() if dest is None else dest
    if is_complete(dest):
        return dest
    python = vllm_python()
    dest.parent.mkdir(parents=True, exist_ok=True)
    partial = dest.with_name(f".{dest.name}.partial-{os.getpid()}")
    shutil.rmtree(partial, ignore_errors=True)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "OMP_NUM_THREADS": "1"}
    done = subprocess.run([str(python), "-m", "fakes.tiny_hf", str(partial)], cwd=ROOT, env=env,
                          stdin=subprocess.DEVNULL, capture_output=True, timeout=WRITE_TIMEOUT_S, check=False)
    if done.returncode != 0 or not is_complete(partial):
        shutil.rmtree(partial, ignore_errors=True)
        output = (done.stdout + done.stderr).decode(errors="replace")[-3000:]
        raise RuntimeError(f"writing the tiny HF model failed (exit {done.returncode}):\n{output}")
    try:
        partial.rename(dest)
    except OSError:  # another writer got there first (or a broken leftover is in the way)
        if not is_complete(dest):
            raise
        shutil.rmtree(partial, ignore_errors=True)
    return dest


# ---------------------------------------------------------------------------------------------
# the writer (runs under the vLLM venv's python)


def training_text(seed: int = SEED, sentences: int = 2000) -> list[str]:
    """Made-up sentences from a fixed word list: the same for a seed, every run."""
    rng = random.Random(seed)
    text = []
    for _ in range(sentences):
        words = [rng.choice(_WORDS) for _ in range(rng.randint(4, 14))]
        number = str(rng.randint(0, 10_000))
        text.append(f"{' '.join(words).capitalize()} {number}{rng.choice('.?!,;:')}")
    return text


def _write(out: Path, seed: int = SEED) -> None:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    specials = [BOS, EOS, *(f"<|{role}|>" for role in ROLES)]
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE, special_tokens=specials, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    bpe.train_from_iterator(training_text(seed), trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, bos_token=BOS, eos_token=EOS,
                                        model_max_length=CONTEXT)
    tokenizer.chat_template = CHAT_TEMPLATE

    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=CONTEXT,
                         tie_word_embeddings=True, bos_token_id=tokenizer.bos_token_id,
                         eos_token_id=tokenizer.eos_token_id, dtype="float32")
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).to(torch.float32)
    with torch.no_grad():  # see the module docstring
        model.get_input_embeddings().weight[tokenizer.convert_tokens_to_ids(specials)] = 0.0
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="directory to write (created)")
    parser.add_argument("--seed", type=int, default=SEED)
    args = parser.parse_args(argv)
    _write(args.out, args.seed)
    print(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
