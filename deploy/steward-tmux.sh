#!/bin/sh
# Runs steward in a tmux session, its event log in a second pane, and stops it as Ctrl-C does.
#   deploy/steward-tmux.sh CONFIG [SESSION]    start (default session: steward; tmux attach -t SESSION)
#   deploy/steward-tmux.sh stop [SESSION]      stop: drain requests in flight, stop engines, close the session
# Start checks the config first (`steward check`): its errors are printed here and nothing starts.
# Then it waits until steward listens (its `listening` event); if steward exits instead, the pane
# stays (remain-on-exit) showing why, the script says steward did not start, and exits 1.
# Stop sends Ctrl-C to steward's pane, waits for steward to exit (up to limits.shutdown_timeout +
# engines.stop_grace + 15 s; then a second Ctrl-C cuts what still runs), then kills the session.
# Use it rather than a bare `tmux kill-session`, which hangs up steward's terminal instead.
# Environment: STEWARD_TMUX_SOCKET=NAME: a tmux server of its own (tmux -L NAME);
# STEWARD_START_TIMEOUT: seconds to wait for steward to listen (60).
set -eu

root=$(cd "$(dirname "$0")/.." && pwd)
steward="$root/.venv/bin/steward"
python="$root/.venv/bin/python"
me="deploy/steward-tmux.sh"

say() { echo "steward-tmux: $*" >&2; }
die() { say "$*"; exit 1; }
tm() {
    if [ -n "${STEWARD_TMUX_SOCKET:-}" ]; then tmux -L "$STEWARD_TMUX_SOCKET" "$@"; else tmux "$@"; fi
}
exit_of() {  # PANE: how steward ended (0, 1, ..., "gone" with its pane); empty while it runs
    # The pane's shell records steward's status: tmux's own #{pane_dead_status} can miss a
    # quick exit (it waits for SIGCHLD), and the pane shows dead before steward is reaped.
    ended=$(tm display-message -p -t "$1" '#{@steward-exit}:#{pane_dead}:#{pane_dead_status}:#{pane_dead_signal}' \
        2>/dev/null) || { echo gone; return 0; }
    case $ended in
        [!:]*) echo "${ended%%:*}" ;;
        :1:?*:*) ended=${ended#:1:}; echo "${ended%%:*}" ;;  # its shell went too, and tmux saw how
        :1::?*) echo "signal ${ended#:1::}" ;;
    esac
}
pane_dead() { [ -n "$(exit_of "$1")" ]; }
wait_dead() {  # PANE SECONDS: true once the pane's process has exited
    deadline=$(( $(date +%s) + $2 ))
    while ! pane_dead "$1"; do
        [ "$(date +%s)" -lt "$deadline" ] || return 1
        sleep 0.2
    done
}

start() {
    [ -f "$1" ] || { say "$1: no such config file"; exit 2; }
    config=$(realpath "$1")
    session=$2
    dir=$(dirname "$config")
    [ -x "$steward" ] || die "$steward is missing: install first (sh deploy/install.sh)"
    command -v tmux >/dev/null 2>&1 || die "tmux is not installed"
    if tm has-session -t "=$session" 2>/dev/null; then
        die "a tmux session '$session' exists already (stop it: $me stop $session)"
    fi
    # A config error must be seen here, not in a pane that closes at once.
    status=0
    plan=$("$steward" check "$config") || status=$?
    if [ "$status" != 0 ]; then
        say "$config is not a valid config (steward check, above): steward was not started"
        exit "$status"
    fi
    printf '%s\n' "$plan" | grep '^ *warning' >&2 || true
    # The event log (absolute), how long a stop may take, and where to knock without a log.
    settings=$("$python" -c '
import sys
from supervisor.config import load_config
config = load_config(sys.argv[1])
host = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(config.listen.host, config.listen.host)
print(config.log.file or "")
print(int(config.limits.shutdown_timeout + config.engines.stop_grace) + 15)
print(host)
print(config.listen.port)' "$config")
    log=$(printf '%s\n' "$settings" | sed -n 1p)
    stop_timeout=$(printf '%s\n' "$settings" | sed -n 2p)
    knock_host=$(printf '%s\n' "$settings" | sed -n 3p)
    knock_port=$(printf '%s\n' "$settings" | sed -n 4p)
    offset=0  # the log may hold earlier runs: only lines after this count
    if [ -n "$log" ] && [ -f "$log" ]; then offset=$(wc -c <"$log"); fi

    # The pane must outlive a steward that exits at once, so remain-on-exit is set before
    # steward is started in it (a placeholder holds the pane meanwhile).
    pane=$(tm new-session -d -P -F '#{pane_id}' -s "$session" -c "$dir" sleep 600)
    tm set-option -w -t "$pane" remain-on-exit on
    tm set-option -t "$pane" @steward-pane "$pane"
    tm set-option -t "$pane" @steward-stop-timeout "$stop_timeout"
    # Ctrl-C reaches the pane's whole process group; the shell only notes it (trap), waits for
    # steward, and records how it ended.
    tm respawn-pane -k -t "$pane" -c "$dir" sh -c 'trap : INT; "$0" run "$1"; code=$?
        tmux set-option -t "$TMUX_PANE" @steward-exit "$code"; echo "steward exited with status $code"' \
        "$steward" "$config"
    if [ -n "$log" ]; then
        filter=cat
        command -v jq >/dev/null 2>&1 && filter="jq -c 'del(.ts, .mono, .v)'"
        # this run's lines: from where the log ended before steward started
        tm split-window -d -v -t "$pane" -c "$dir" sh -c \
            'touch "$0" 2>/dev/null; tail -c +"$1" -F "$0" | '"$filter" "$log" "$((offset + 1))"
    fi

    deadline=$(( $(date +%s) + ${STEWARD_START_TIMEOUT:-60} ))
    url=""
    while [ -z "$url" ]; do
        if pane_dead "$pane"; then
            say "steward did not start: it exited with status $(exit_of "$pane"). Its pane:"
            tm capture-pane -p -J -t "$pane" -S -40 2>/dev/null | sed '/^$/d' >&2 || true
            say "the pane stays for you to read (tmux attach -t $session); close it: $me stop $session"
            exit 1
        fi
        if [ -n "$log" ]; then
            size=$(wc -c <"$log" 2>/dev/null || echo 0)
            [ "$size" -ge "$offset" ] || offset=0  # the log was rotated
            url=$(tail -c +"$((offset + 1))" "$log" 2>/dev/null | grep '"event":"listening"' | head -n 1 |
                sed -n 's/.*"urls":\["\([^"]*\)".*/\1/p') || true
        elif "$python" -c 'import socket, sys; socket.create_connection((sys.argv[1], int(sys.argv[2])), 1).close()' \
                "$knock_host" "$knock_port" 2>/dev/null; then
            url="http://$knock_host:$knock_port"
        fi
        if [ -z "$url" ]; then
            [ "$(date +%s)" -lt "$deadline" ] || die "steward is not listening after ${STEWARD_START_TIMEOUT:-60}s;" \
                "it still runs in tmux session '$session' (tmux attach -t $session to see why)"
            sleep 0.2
        fi
    done
    echo "steward is running in tmux session '$session' on $url (attach: tmux attach -t $session; stop: $me stop $session)"
}

stop() {
    session=$1
    tm has-session -t "=$session" 2>/dev/null || die "no tmux session '$session'"
    pane=$(tm show-options -qv -t "=$session:" @steward-pane 2>/dev/null || true)
    [ -n "$pane" ] || pane=$(tm list-panes -s -t "=$session" -F '#{pane_id}' | head -n 1)
    timeout=$(tm show-options -qv -t "=$session:" @steward-stop-timeout 2>/dev/null || true)
    timeout=${timeout:-60}
    if ! pane_dead "$pane"; then
        say "Ctrl-C to steward: draining requests in flight, then stopping engines (waiting up to ${timeout}s)"
        tm send-keys -t "$pane" C-c
        if ! wait_dead "$pane" "$timeout"; then
            say "steward still runs after ${timeout}s: Ctrl-C again, cutting the requests still in flight"
            tm send-keys -t "$pane" C-c
            if ! wait_dead "$pane" "$timeout"; then
                tm kill-session -t "=$session"
                die "steward still ran after a second ${timeout}s; session '$session' killed (steward got SIGHUP)"
            fi
        fi
    fi
    code=$(exit_of "$pane")
    tm kill-session -t "=$session" 2>/dev/null || true
    [ "$code" = 0 ] || die "steward exited with status $code; session '$session' closed"
    say "steward stopped; session '$session' closed"
}

case "${1:-}" in
    ""|-h|--help) echo "usage: $me CONFIG [SESSION] | $me stop [SESSION]" >&2; [ -n "${1:-}" ] ;;
    stop) stop "${2:-steward}" ;;
    *) start "$1" "${2:-steward}" ;;
esac
