#!/bin/sh
# The GPU check in one command, for the day a GPU is lent: `steward gpu-check` (builds the CUDA
# llama-server once, runs SmolLM2 and tiny models under steward with gpu.probe: nvml, prints the
# ledger against NVML, the estimates against the CUDA buffers, and the phantom-memory guard on a
# kill -9). Its flags pass on (--simulated: the same on a simulated GPU, no GPU needed).
#     sh deploy/gpu-check.sh [--simulated] [--llama-server PATH] [--keep]
# With OUT set, the report, the config, the event log and steward's output go into $OUT as
# gpu-check-*, and this script's whole output into $OUT/gpu-check.log.
# Its Python: STEWARD_PYTHON, else ./.venv (made by deploy/install.sh), else python3 when it has
# steward's dependencies. Missing them, it installs: from the wheels in STEWARD_WHEELS (a folder,
# no network needed) beside python3's own packages (pip --target, in ${TMPDIR:-/tmp}), else with
# deploy/install.sh (network); failing that, it names the modules that are missing.
# Exit status: steward gpu-check's (0 every step ran, 1 not, 3 no NVIDIA driver), 4 no Python to run it.
set -eu
cd "$(dirname "$0")/.."

log() { echo "gpu-check.sh: $*" >&2; }
modules="trio hypercorn httpx quart_trio pynvml attrs cattrs yaml gguf numpy trio_websocket prometheus_client h11 rich"
pypath=$(pwd)
missing() {  # the modules $1 cannot import, or nothing
    PYTHONPATH="$pypath" "$1" -c "import importlib.util, sys
print(' '.join(m for m in sys.argv[1:] if importlib.util.find_spec(m) is None))" $modules 2>/dev/null || echo "(python does not run)"
}

python="${STEWARD_PYTHON:-}"
if [ -z "$python" ]; then
    for candidate in .venv/bin/python python3; do
        if command -v "$candidate" >/dev/null 2>&1 && [ -z "$(missing "$candidate")" ]; then
            python=$candidate
            break
        fi
    done
fi
if [ -z "$python" ]; then
    if [ -n "${STEWARD_WHEELS:-}" ]; then
        site="${TMPDIR:-/tmp}/steward-gpu-check-site"
        log "installing the wheels in $STEWARD_WHEELS into $site, beside python3's own packages"
        python3 -m pip install --quiet --no-index --no-deps --no-compile --target "$site" "$STEWARD_WHEELS"/*.whl >&2 || true
        pypath="$(pwd):$site"
        candidate=python3
    else
        log "installing steward into .venv with deploy/install.sh (needs network)"
        sh deploy/install.sh >&2 || true
        candidate=.venv/bin/python
    fi
    absent=$(missing "$candidate")
    if [ -z "$absent" ]; then
        python=$candidate
    else
        log "error: no Python with steward's dependencies; $candidate lacks: $absent"
        log "without network, bring them as wheels (pip download -d WHEELS NAME... where there is network) and set STEWARD_WHEELS=WHEELS"
        exit 4
    fi
fi

if [ -z "${OUT:-}" ]; then
    PYTHONPATH="$pypath" exec "$python" -m supervisor.cli gpu-check "$@"
fi
mkdir -p "$OUT"
status_file=$(mktemp)
{ PYTHONPATH="$pypath" "$python" -m supervisor.cli gpu-check --save "$OUT" "$@" && s=0 || s=$?; echo "$s" >"$status_file"; } 2>&1 |
    tee "$OUT/gpu-check.log"
status=$(cat "$status_file")
rm -f "$status_file"
exit "$status"
