# Sourced by the install scripts (deploy/install-vllm.sh, deploy/install-comfyui.sh): where the
# cache is, and one install of a thing at a time.
cache_root="${STEWARD_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpu-steward}"

# finish_if_installed DONE_MARK EXECUTABLE ANSWER: print ANSWER and exit when the install is complete.
finish_if_installed() {
    if [ -f "$1" ] && [ -x "$2" ]; then
        echo "$3"
        exit 0
    fi
}

# claim_install NAME DONE_MARK EXECUTABLE ANSWER: print ANSWER and exit when NAME is installed,
# else wait for any other install of it to end (where flock exists) and look again.
claim_install() {
    finish_if_installed "$2" "$3" "$4"
    mkdir -p "$cache_root"
    if command -v flock >/dev/null 2>&1; then
        exec 9>"$cache_root/.install-$1.lock"
        flock 9
    fi
    finish_if_installed "$2" "$3" "$4"
}
