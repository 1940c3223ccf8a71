#!/bin/sh
# Builds a CPU-only, statically linked llama.cpp `llama-server` for the tests, from the
# llama.cpp source vendored in the llama-cpp-python sdist on PyPI, into a cache reused by
# later runs:
#     ${STEWARD_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpu-steward}/llama-server-<version>/bin/llama-server
# The version is LLAMA_CPP_PYTHON_VERSION in fakes/llama_binary.py (the one place to change it).
# Prints the binary's path as the last line of stdout; progress goes to stderr.
# When the binary is cached and runs, it returns at once. A build takes ~5 min on 2 cores;
# an interrupted build resumes where it stopped, and the binary appears only once complete.
# Needs cmake, a C++ compiler and make (or ninja); when they are missing and this runs as
# root on Debian/Ubuntu, they are installed with apt-get.
set -eu
cd "$(dirname "$0")/.."

log() { echo "build-llama-server: $*" >&2; }
die() { log "error: $*"; exit 1; }

version=$(sed -n 's/^LLAMA_CPP_PYTHON_VERSION *= *"\([^"]*\)".*/\1/p' fakes/llama_binary.py)
[ -n "$version" ] || die "cannot read LLAMA_CPP_PYTHON_VERSION from fakes/llama_binary.py"

root="${STEWARD_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpu-steward}"
dest="$root/llama-server-$version"
bin="$dest/bin/llama-server"

# fast path: already built and runnable
if [ -x "$bin" ] && "$bin" --version >/dev/null 2>&1; then
    echo "$bin"
    exit 0
fi

# --- tools -----------------------------------------------------------------------------
have() { command -v "$1" >/dev/null 2>&1; }
have_cxx() { have c++ || have g++ || have clang++; }
have_gen() { have ninja || have make; }
if ! have cmake || ! have_cxx || ! have_gen; then
    if [ "$(id -u)" = 0 ] && have apt-get; then
        log "installing cmake, g++ and make with apt-get"
        DEBIAN_FRONTEND=noninteractive apt-get update -q >&2
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
            cmake g++ make ca-certificates >&2
    else
        missing=""
        have cmake || missing="$missing cmake"
        have_cxx || missing="$missing c++-compiler"
        have_gen || missing="$missing make"
        die "missing build tools:$missing; install them (Debian: apt-get install cmake g++ make) or run this as root to have them installed"
    fi
fi
if [ -x .venv/bin/python ]; then python=.venv/bin/python; else python=python3; fi
"$python" -m pip --version >/dev/null 2>&1 || die "$python has no pip; run sh deploy/install.sh first"

# --- source ----------------------------------------------------------------------------
# Work happens in $work, kept in the cache until the build succeeds so that a killed run
# resumes (download, unpack and compiled objects are reused); removed afterwards.
work="$root/.build-llama-server-$version"
mkdir -p "$work"
if have flock; then  # one build at a time; a run that waited finds the binary built
    exec 9>"$root/.build-llama-server-$version.lock"
    flock 9
    if [ -x "$bin" ] && "$bin" --version >/dev/null 2>&1; then
        echo "$bin"
        exit 0
    fi
    mkdir -p "$work"
fi
sdist="$work/sdist/llama_cpp_python-$version.tar.gz"
if [ ! -f "$sdist" ]; then
    log "downloading the llama-cpp-python $version sdist from PyPI"
    rm -rf "$work/sdist.tmp"
    "$python" -m pip download --quiet --disable-pip-version-check --no-binary :all: --no-deps \
        "llama-cpp-python==$version" -d "$work/sdist.tmp" >&2
    found=$(ls "$work"/sdist.tmp/llama_cpp_python-"$version".tar.gz 2>/dev/null || true)
    [ -n "$found" ] || die "pip did not download llama_cpp_python-$version.tar.gz"
    rm -rf "$work/sdist"
    mv "$work/sdist.tmp" "$work/sdist"
fi
src="$work/src/llama_cpp_python-$version/vendor/llama.cpp"
if [ ! -f "$work/src/.unpacked" ]; then
    log "unpacking $sdist"
    rm -rf "$work/src"
    mkdir -p "$work/src"
    tar -xzf "$sdist" -C "$work/src"
    [ -f "$src/CMakeLists.txt" ] || die "no vendor/llama.cpp/CMakeLists.txt in the sdist"
    : >"$work/src/.unpacked"
fi

# --- build -----------------------------------------------------------------------------
# CPU only, static, no HTTPS/libcurl, no web UI download, no OpenMP runtime dependency.
# GGML_NATIVE=OFF: ggml's portable x86-64 set (SSE4.2, AVX, AVX2, FMA, F16C, BMI2; any
# x86-64 CPU since 2013/2015), not -march=native, so the cached binary moves between hosts.
jobs=$(nproc 2>/dev/null || getconf _NPROCESSORS_ONLN 2>/dev/null || echo 2)
generator=""
have ninja && generator="-G Ninja"
build="$work/build"
if [ ! -f "$build/CMakeCache.txt" ]; then
    log "configuring llama.cpp from $src"
    rm -rf "$build"
    # shellcheck disable=SC2086
    cmake -S "$src" -B "$build" $generator \
        -DCMAKE_BUILD_TYPE=Release \
        -DBUILD_SHARED_LIBS=OFF \
        -DGGML_NATIVE=OFF \
        -DGGML_OPENMP=OFF \
        -DGGML_CCACHE=OFF \
        -DLLAMA_BUILD_TESTS=OFF \
        -DLLAMA_BUILD_EXAMPLES=OFF \
        -DLLAMA_BUILD_APP=OFF \
        -DLLAMA_BUILD_TOOLS=ON \
        -DLLAMA_BUILD_SERVER=ON \
        -DLLAMA_BUILD_UI=OFF \
        -DLLAMA_USE_PREBUILT_UI=OFF \
        -DLLAMA_OPENSSL=OFF >&2 || { rm -f "$build/CMakeCache.txt"; die "cmake configure failed"; }
fi
log "building llama-server with $jobs jobs (about 5 minutes on 2 cores)"
started=$(date +%s)
cmake --build "$build" --target llama-server -j "$jobs" >&2 || die "build failed (see above)"
log "built in $(( $(date +%s) - started )) s"

# --- install atomically -----------------------------------------------------------------
stage="$work/stage"
rm -rf "$stage"
mkdir -p "$stage/bin"
cp "$build/bin/llama-server" "$stage/bin/llama-server.tmp"
strip "$stage/bin/llama-server.tmp" 2>/dev/null || true
mv "$stage/bin/llama-server.tmp" "$stage/bin/llama-server"
"$stage/bin/llama-server" --version >&2 || die "the built llama-server does not run"
rm -rf "$dest"
mv "$stage" "$dest"
rm -rf "$work"
log "installed $bin"
echo "$bin"
