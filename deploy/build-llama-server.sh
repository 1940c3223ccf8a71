#!/bin/sh
# Builds a CPU-only, statically linked llama.cpp `llama-server` for the tests, from the
# llama.cpp source vendored in the llama-cpp-python sdist on PyPI, into a cache reused by
# later runs:
#     ${STEWARD_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpu-steward}/llama-server-<version>/bin/llama-server
# `--cuda`: the same llama-server with llama.cpp's CUDA backend (GGML_CUDA=ON) instead, into
# llama-server-cuda-<version>/ (`steward gpu-check` runs it); needs nvcc and cuBLAS, and says
# which is missing. Built for the GPU that nvidia-smi shows (STEWARD_CUDA_ARCHITECTURES, e.g.
# "90-real", chooses; with neither, llama.cpp's whole default list, a much longer build).
# The version is LLAMA_CPP_PYTHON_VERSION in fakes/llama_binary.py (the one place to change it).
# The sdist is kept in the cache (sdist/), so a later build needs no network; STEWARD_LLAMA_SRC
# names another sdist, or an unpacked llama.cpp source folder, to build from instead.
# Prints the binary's path as the last line of stdout; progress goes to stderr.
# When the binary is cached and runs, it returns at once. A build takes ~5 min on 2 cores;
# an interrupted build resumes where it stopped, and the binary appears only once complete.
# Needs cmake, a C++ compiler and make (or ninja); when they are missing and this runs as
# root on Debian/Ubuntu, they are installed with apt-get.
set -eu
cd "$(dirname "$0")/.."

log() { echo "build-llama-server: $*" >&2; }
die() { log "error: $*"; exit 1; }

variant=cpu
case "${1:-}" in
    "") ;;
    --cuda) variant=cuda ;;
    *) die "unknown argument $1 (the one option is --cuda)" ;;
esac

version=$(sed -n 's/^LLAMA_CPP_PYTHON_VERSION *= *"\([^"]*\)".*/\1/p' fakes/llama_binary.py)
[ -n "$version" ] || die "cannot read LLAMA_CPP_PYTHON_VERSION from fakes/llama_binary.py"

root="${STEWARD_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpu-steward}"
name=llama-server
[ "$variant" = cuda ] && name=llama-server-cuda
dest="$root/$name-$version"
bin="$dest/bin/llama-server"

# runnable: the CUDA build needs the driver's libcuda to start, so where there is none it
# counts as built once it is there (gpu-check looks for the driver first)
runnable() {
    [ -x "$1" ] || return 1
    if [ "$variant" = cuda ] && ! nvidia-smi >/dev/null 2>&1; then
        return 0
    fi
    "$1" --version >/dev/null 2>&1
}

# fast path: already built and runnable
if runnable "$bin"; then
    echo "$bin"
    exit 0
fi
if [ -x .venv/bin/python ]; then python=.venv/bin/python; else python=python3; fi

# --- CUDA: nvcc and cuBLAS ---------------------------------------------------------------
cuda_flags=""
if [ "$variant" = cuda ]; then
    nvcc="${CUDACXX:-$(command -v nvcc 2>/dev/null || true)}"
    if [ -z "$nvcc" ] && [ -x "${CUDA_HOME:-/usr/local/cuda}/bin/nvcc" ]; then
        nvcc="${CUDA_HOME:-/usr/local/cuda}/bin/nvcc"
    fi
    [ -n "$nvcc" ] && [ -x "$nvcc" ] || die "nvcc not found (not in CUDACXX, on PATH, or in ${CUDA_HOME:-/usr/local/cuda}/bin): the CUDA llama-server needs the CUDA toolkit's compiler"
    # nvcc may be a wrapper script: ask it where its toolkit is
    here=$("$nvcc" --dryrun -E -x cu /dev/null 2>&1 | sed -n 's/^#\$ _HERE_=//p' | head -1)
    cuda_root=$(dirname "${here:-$(dirname "$(readlink -f "$nvcc")")}")
    log "nvcc: $nvcc ($("$nvcc" --version | sed -n 's/.*release \([0-9.]*\).*/CUDA \1/p')), toolkit in $cuda_root"
    # cuBLAS: the toolkit's own, or the one in Python's nvidia packages (pip's nvidia-cublas)
    places="$cuda_root /usr/lib/x86_64-linux-gnu /usr/local/lib $("$python" -c 'import nvidia; print(*nvidia.__path__)' 2>/dev/null || true)"
    # shellcheck disable=SC2086  # folders without spaces
    cublas=$(find $places -maxdepth 4 -name 'libcublas.so*' 2>/dev/null | sort | head -1)
    [ -n "$cublas" ] || die "cuBLAS not found (no libcublas.so* in $places): llama.cpp's CUDA backend links it; install the CUDA toolkit's cuBLAS (Debian: libcublas-dev-13-0) or pip's nvidia-cublas"
    cublas_dir=$(dirname "$cublas")
    # shellcheck disable=SC2086
    header=$(find "$cuda_root" "$(dirname "$cublas_dir")" -maxdepth 4 -name cublas_v2.h 2>/dev/null | head -1)
    [ -n "$header" ] || die "cuBLAS's headers not found (no cublas_v2.h in $cuda_root or beside $cublas_dir)"
    log "cuBLAS: $cublas, headers in $(dirname "$header")"
    case "$cublas_dir" in
        "$cuda_root"/*) ;;
        *)  cublas_lt=$(find "$cublas_dir" -maxdepth 1 -name 'libcublasLt.so*' | sort | head -1)
            [ -n "$cublas_lt" ] || die "libcublasLt.so* not found beside $cublas"
            inc=$(dirname "$header")
            cuda_flags="-DCUDA_cublas_LIBRARY=$cublas -DCUDA_cublasLt_LIBRARY=$cublas_lt -DCMAKE_BUILD_RPATH=$cublas_dir -DCMAKE_CUDA_FLAGS=-I$inc -DCMAKE_CXX_FLAGS=-I$inc" ;;
    esac
    # libcuda (the driver's; or the toolkit's link stub): llama.cpp links it for its VMM memory pool.
    # shellcheck disable=SC2086
    driver=$(find /usr/lib/x86_64-linux-gnu /usr/local/nvidia/lib64 /usr/lib64 "$cuda_root/lib64/stubs" \
        "$cuda_root/targets/x86_64-linux/lib/stubs" -maxdepth 1 -name 'libcuda.so*' 2>/dev/null | head -1)
    if [ -n "$driver" ]; then
        cuda_flags="$cuda_flags -DCUDA_cuda_driver_LIBRARY=$driver"
    else
        log "no libcuda.so (driver or stub) to link: built without llama.cpp's VMM pool (GGML_CUDA_NO_VMM)"
        cuda_flags="$cuda_flags -DGGML_CUDA_NO_VMM=ON"
    fi
    archs="${STEWARD_CUDA_ARCHITECTURES:-}"
    if [ -z "$archs" ]; then
        cap=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d ' .' || true)
        [ -n "$cap" ] && archs="$cap-real"
    fi
    if [ -n "$archs" ]; then
        cuda_flags="$cuda_flags -DCMAKE_CUDA_ARCHITECTURES=$archs"
        log "CUDA architectures: $archs"
    else
        log "no GPU seen and no STEWARD_CUDA_ARCHITECTURES: every architecture llama.cpp builds by default (a long build)"
    fi
    export CUDACXX="$nvcc"
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

# --- source ----------------------------------------------------------------------------
# Work happens in $work, kept in the cache until the build succeeds so that a killed run
# resumes (unpacked source and compiled objects are reused); removed afterwards. The sdist
# stays in $root/sdist for the next build (the other variant's too).
work="$root/.build-$name-$version"
mkdir -p "$work"
if have flock; then  # one build at a time; a run that waited finds the binary built
    exec 9>"$root/.build-$name-$version.lock"
    flock 9
    if runnable "$bin"; then
        echo "$bin"
        exit 0
    fi
    mkdir -p "$work"
fi
given="${STEWARD_LLAMA_SRC:-}"
if [ -n "$given" ] && [ -f "$given/CMakeLists.txt" ]; then
    src="$given"
    log "building from the llama.cpp source in $given (STEWARD_LLAMA_SRC)"
else
    sdist="${given:-$root/sdist/llama_cpp_python-$version.tar.gz}"
    if [ ! -f "$sdist" ]; then
        [ -z "$given" ] || die "STEWARD_LLAMA_SRC=$given is neither an sdist nor a llama.cpp source folder"
        "$python" -m pip --version >/dev/null 2>&1 || die "$python has no pip to download the sdist; run sh deploy/install.sh first"
        log "downloading the llama-cpp-python $version sdist from PyPI"
        rm -rf "$root/sdist.tmp"
        "$python" -m pip download --quiet --disable-pip-version-check --no-binary :all: --no-deps \
            "llama-cpp-python==$version" -d "$root/sdist.tmp" >&2 ||
            die "no llama-cpp-python $version sdist in $root/sdist and pip could not download it (no network?); put llama_cpp_python-$version.tar.gz there, or set STEWARD_LLAMA_SRC to it or to a llama.cpp source folder"
        found=$(ls "$root"/sdist.tmp/llama_cpp_python-"$version".tar.gz 2>/dev/null || true)
        [ -n "$found" ] || die "pip did not download llama_cpp_python-$version.tar.gz"
        mkdir -p "$root/sdist"
        mv "$found" "$sdist"
        rm -rf "$root/sdist.tmp"
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
fi

# --- build -----------------------------------------------------------------------------
# CPU only (or CUDA with --cuda), static, no HTTPS/libcurl, no web UI download, no OpenMP
# runtime dependency. GGML_NATIVE=OFF: ggml's portable x86-64 set (SSE4.2, AVX, AVX2, FMA,
# F16C, BMI2; any x86-64 CPU since 2013/2015), not -march=native, so the cached binary moves
# between hosts. With CUDA, cudart and cuBLAS stay shared libraries; no NCCL (one GPU).
jobs=$(nproc 2>/dev/null || getconf _NPROCESSORS_ONLN 2>/dev/null || echo 2)
generator=""
have ninja && generator="-G Ninja"
build="$work/build"
if [ ! -f "$build/CMakeCache.txt" ]; then
    log "configuring llama.cpp ($variant) from $src"
    rm -rf "$build"
    backend="-DGGML_CUDA=OFF"
    [ "$variant" = cuda ] && backend="-DGGML_CUDA=ON -DGGML_CUDA_NCCL=OFF $cuda_flags"
    # shellcheck disable=SC2086
    cmake -S "$src" -B "$build" $generator $backend \
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
log "building $name with $jobs jobs (the CPU build: about 5 minutes on 2 cores)"
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
runnable "$stage/bin/llama-server" || { "$stage/bin/llama-server" --version >&2; die "the built llama-server does not run"; }
rm -rf "$dest"
mv "$stage" "$dest"
rm -rf "$work"
log "installed $bin"
echo "$bin"
