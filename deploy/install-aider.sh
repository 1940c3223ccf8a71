#!/bin/sh
# Installs the real aider (PyPI `aider-chat`) for the tests into its own virtual environment in
# a cache reused by later runs:
#     ${STEWARD_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpu-steward}/aider-chat-<version>/bin/aider
# The version is AIDER_VERSION in fakes/aider_env.py (the one place to change it).
# Prints the aider executable as the last line of stdout; progress goes to stderr.
# When the venv is complete it returns at once; an install takes about 40 s.
set -eu
cd "$(dirname "$0")/.."

log() { echo "install-aider: $*" >&2; }
die() { log "error: $*"; exit 1; }

version=$(sed -n 's/^AIDER_VERSION *= *"\([^"]*\)".*/\1/p' fakes/aider_env.py)
[ -n "$version" ] || die "cannot read AIDER_VERSION from fakes/aider_env.py"

. deploy/install-lib.sh
dest="$cache_root/aider-chat-$version"
done_mark="$dest/.complete"
claim_install "aider-$version" "$done_mark" "$dest/bin/aider" "$dest/bin/aider"

started=$(date +%s)
log "installing aider-chat==$version into $dest (under a minute)"
# a venv left by an install that did not finish is made anew
python3 -m venv --clear "$dest" || die "python3 -m venv failed (Debian: apt-get install python3-venv)"
"$dest/bin/python" -m pip install --quiet --disable-pip-version-check "aider-chat==$version" >&2 \
    || die "pip install aider-chat==$version failed (it needs Python 3.10 to 3.12; python3 is $(python3 -V 2>&1))"
"$dest/bin/aider" --version >&2 || die "aider does not start in $dest"
: >"$done_mark"
log "installed in $(( $(date +%s) - started )) s"
echo "$dest/bin/aider"
