#!/bin/sh
# Installs Debian's chromium and chromium-driver for the /ui page's browser test
# (tests/test_ui_browser.py); skipped when both are there. Needs root (or sudo) and apt-get.
set -eu
log() { echo "install-chromium: $*" >&2; }
if command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1; then
    exit 0
fi
command -v apt-get >/dev/null 2>&1 || { log "error: no apt-get: install chromium and chromedriver yourself"; exit 1; }
sudo=""
[ "$(id -u)" = 0 ] || sudo="sudo"
log "installing chromium and chromium-driver (apt-get)"
$sudo apt-get update -qq >&2
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq chromium chromium-driver >&2
