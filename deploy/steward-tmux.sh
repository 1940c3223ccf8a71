#!/bin/sh
# Runs steward in a tmux session with its event log in a second pane.
#   deploy/steward-tmux.sh CONFIG [SESSION]     (attach: tmux attach -t steward)
set -eu
config=$(realpath "${1:?usage: steward-tmux.sh CONFIG [SESSION]}")
session=${2:-steward}
root=$(cd "$(dirname "$0")/.." && pwd)
log=$(cd "$(dirname "$config")" && "$root/.venv/bin/python" -c "
import sys, yaml; c = yaml.safe_load(open(sys.argv[1])); print((c.get('log') or {}).get('file', 'steward-events.jsonl') or '')
" "$config")
tmux new-session -d -s "$session" -c "$(dirname "$config")" "$root/.venv/bin/steward run '$config'"
if [ -n "$log" ]; then
    filter=cat
    command -v jq >/dev/null && filter="jq -c 'del(.ts, .mono)'"
    tmux split-window -v -t "$session" -c "$(dirname "$config")" "touch '$log'; tail -F '$log' | $filter"
fi
echo "steward is running in tmux session '$session' (tmux attach -t $session)"
