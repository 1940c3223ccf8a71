#!/bin/sh
# Installs the real coding-agent CLIs the tests drive through steward, Claude Code
# (`@anthropic-ai/claude-code`) and Codex (`@openai/codex`), from the npm registry into a cache
# reused by later runs:
#     ${STEWARD_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpu-steward}/agent-clis-<claude>-<codex>/node_modules/.bin/
# The versions are CLAUDE_CODE_VERSION and CODEX_VERSION in fakes/agent_clis.py (the one place to
# change them). Both ship native binaries (about 800 MB together); Node.js and npm are needed to
# install them (and to start `codex`, a Node script): where npm is missing it is installed with
# apt-get (Debian's nodejs and npm) when that can be done, else the script says what to install.
# Prints the install folder as the last line of stdout; progress goes to stderr.
# When the install is complete it returns at once; an install takes about 15 seconds.
set -eu
cd "$(dirname "$0")/.."

log() { echo "install-agent-clis: $*" >&2; }
die() { log "error: $*"; exit 1; }

pin() { sed -n "s/^$1 *= *\"\([^\"]*\)\".*/\1/p" fakes/agent_clis.py; }
claude=$(pin CLAUDE_CODE_VERSION)
codex=$(pin CODEX_VERSION)
[ -n "$claude" ] && [ -n "$codex" ] || die "cannot read the versions from fakes/agent_clis.py"

. deploy/install-lib.sh
name="agent-clis-$claude-$codex"
claim_install "$name" "$cache_root/$name/.complete" "$cache_root/$name/node_modules/.bin/codex" "$cache_root/$name"
dest="$cache_root/$name"

if ! command -v npm >/dev/null 2>&1 || ! command -v node >/dev/null 2>&1; then
    as_root=""
    [ "$(id -u)" = 0 ] || as_root="sudo -n"
    if command -v apt-get >/dev/null 2>&1 && $as_root true 2>/dev/null; then
        log "installing Debian's nodejs and npm with apt-get"
        $as_root apt-get update -q >&2 || die "apt-get update failed"
        DEBIAN_FRONTEND=noninteractive $as_root apt-get install -y -q --no-install-recommends nodejs npm >&2 \
            || die "apt-get install nodejs npm failed"
    else
        die "node and npm are missing; install Node.js 18 or later with npm (Debian: sudo apt-get install nodejs npm)"
    fi
fi

started=$(date +%s)
rm -rf "$dest"
mkdir -p "$dest"
log "installing @anthropic-ai/claude-code@$claude and @openai/codex@$codex into $dest (about 15 seconds)"
# Claude Code's postinstall copies its platform's native binary over the placeholder bin/claude.exe
npm install --prefix "$dest" --no-audit --no-fund --no-update-notifier --loglevel=error \
    "@anthropic-ai/claude-code@$claude" "@openai/codex@$codex" >&2 || die "npm install failed (see above)"

for cli in claude codex; do
    version=$("$dest/node_modules/.bin/$cli" --version 2>&1) || die "$cli --version failed: $version"
    log "$version"
done
case $("$dest/node_modules/.bin/claude" --version) in
    "$claude "*) ;;
    *) die "claude --version does not say $claude (its postinstall did not put the native binary in place?)" ;;
esac
: >"$dest/.complete"
log "installed in $(( $(date +%s) - started )) s"
echo "$dest"
