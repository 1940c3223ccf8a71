#!/bin/sh
# Installs the real ComfyUI (CPU) for the tests, from the source STEWARD_COMFYUI_SRC names (its
# .tar.gz or its unpacked folder; ComfyUI is not on PyPI), into a cache reused by later runs:
#     ${STEWARD_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpu-steward}/comfyui-<version>/{ComfyUI,venv}
# The versions are in fakes/comfyui_env.py (the one place to change them). Without
# STEWARD_COMFYUI_SRC there is nothing to install: it says so and exits 0.
# Prints the install's folder as the last line of stdout; progress goes to stderr.
# When the install is complete it returns at once; an install takes about 2 minutes (1.7 GB).
# The recipe is in ../shared/research/real_runtimes.md: torch pinned to the CPU build on this
# machine's disk; ComfyUI's requirements without the torch/torchvision/torchaudio/kornia/spandrel
# lines, with `requests` (imported by app/frontend_management.py, not in its requirements),
# constrained to that torch; then torchvision, spandrel and kornia without their dependencies
# (they would pull a CUDA torch), and torchvision's `_meta_registrations.py` emptied: it
# registers kernels the CPU torch lacks (`operator torchvision::nms does not exist`).
set -eu
cd "$(dirname "$0")/.."

log() { echo "install-comfyui: $*" >&2; }
die() { log "error: $*"; exit 1; }
pin() { sed -n "s/^$1 *= *\"\([^\"]*\)\".*/\1/p" fakes/comfyui_env.py; }

version=$(pin COMFYUI_VERSION)
torch=$(pin TORCH_VERSION)
torchvision=$(pin TORCHVISION_VERSION)
[ -n "$version" ] && [ -n "$torch" ] && [ -n "$torchvision" ] \
    || die "cannot read the versions from fakes/comfyui_env.py"

src="${STEWARD_COMFYUI_SRC:-}"
if [ -z "$src" ]; then
    log "STEWARD_COMFYUI_SRC is not set: no ComfyUI $version source to install from (nothing done;" \
        "the tests that need the real ComfyUI will skip)"
    exit 0
fi
[ -e "$src" ] || die "STEWARD_COMFYUI_SRC=$src does not exist"
src=$(cd "$(dirname "$src")" && echo "$(pwd)/$(basename "$src")")

. deploy/install-lib.sh
dest="$cache_root/comfyui-$version"
done_mark="$dest/.complete"
claim_install "comfyui-$version" "$done_mark" "$dest/venv/bin/python" "$dest"

started=$(date +%s)
mkdir -p "$dest"
# The source: unpacked afresh each time an install is (re)done, so a half-unpacked one never stays.
rm -rf "$dest/ComfyUI" "$dest/unpack"
mkdir "$dest/unpack"
if [ -d "$src" ]; then
    cp -R "$src/." "$dest/unpack/" || die "cannot copy $src"
else
    tar -xzf "$src" -C "$dest/unpack" || die "cannot unpack $src (a .tar.gz or a folder is expected)"
fi
main=$(find "$dest/unpack" -maxdepth 2 -name main.py -print | sort | head -n 1)
[ -n "$main" ] && [ -f "$(dirname "$main")/comfyui_version.py" ] \
    || die "$src holds no ComfyUI source (no main.py beside comfyui_version.py)"
found=$(sed -n 's/^__version__ *= *"\([^"]*\)".*/\1/p' "$(dirname "$main")/comfyui_version.py")
[ "$found" = "$version" ] || die "$src is ComfyUI $found; the tests pin $version (fakes/comfyui_env.py)"
mv "$(dirname "$main")" "$dest/ComfyUI"
rm -rf "$dest/unpack"

venv="$dest/venv"
if [ ! -x "$venv/bin/python" ]; then
    rm -rf "$venv"
    python3 -m venv "$venv" || die "python3 -m venv failed (Debian: apt-get install python3-venv)"
fi
pip() { "$venv/bin/python" -m pip --disable-pip-version-check "$@"; }
log "installing torch==$torch and ComfyUI $version's requirements into $venv (about 2 minutes)"
# torch first and pinned: plain `torch` from a requirement would take a CUDA build of GBs
pip install --quiet "torch==$torch" >&2 || die "pip install torch==$torch failed"
requirements="$dest/requirements.txt"
constraints="$dest/constraints.txt"
grep -v -E '^(torch|torchvision|torchaudio|kornia|spandrel)([^A-Za-z0-9_.-]|$)' "$dest/ComfyUI/requirements.txt" \
    >"$requirements"
echo requests >>"$requirements"
echo "torch==$torch" >"$constraints"
pip install --quiet -r "$requirements" -c "$constraints" >&2 || die "pip install of ComfyUI's requirements failed"
pip install --quiet --no-deps "torchvision==$torchvision" spandrel kornia kornia_rs >&2 \
    || die "pip install --no-deps torchvision spandrel kornia failed"
site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
: >"$site/torchvision/_meta_registrations.py"

(cd "$dest/ComfyUI" && "$venv/bin/python" -c \
    'import torch, torchvision, torchsde, kornia, spandrel, aiohttp, requests, comfy.utils; print(torch.__version__)') \
    >&2 || die "ComfyUI's modules do not import in $venv"
: >"$done_mark"
log "installed in $(( $(date +%s) - started )) s"
echo "$dest"
