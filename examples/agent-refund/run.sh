#!/usr/bin/env bash
# Runs the refund agent end to end with no API key: builds the step, starts
# the scripted model server and the demo receiver on free ports, writes the
# configuration for them, and runs the step with `cargo run -p stephost`.
#
#   examples/agent-refund/run.sh                      # order A-1001, $49.99: no approval
#   examples/agent-refund/run.sh "Please refund order A-1002, it never came."
#                                                     # $250.00: waits for a person's approval
#   examples/agent-refund/run.sh --approve-as ana "Please refund order A-1002."
#                                                     # ... which ana gives, and the run goes on
#
# Environment: STEPHOST_LEDGER (default sqlite:stephost.db, in the repository),
# AGENT_CONFIG (default examples/agent-refund/stephost.toml). When the
# configuration's model is not the local scripted server (127.0.0.1:8081),
# no model server is started and the model's key_env must be set.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
cd "$root"

approve_as=""
if [[ "${1:-}" == "--approve-as" ]]; then
    approve_as="${2:?--approve-as needs a name}"
    shift 2
fi
default_message="Hi, I'd like a refund for order A-1001: the blender arrived broken. Thanks, Sam"
message="${1:-$default_message}"
config_in="${AGENT_CONFIG:-$here/stephost.toml}"
ledger="${STEPHOST_LEDGER:-sqlite:stephost.db}"
export STEPHOST_LEDGER="$ledger"

work="$(mktemp -d "${TMPDIR:-/tmp}/agent-refund.XXXXXX")"
pids=()
cleanup() {
    for pid in "${pids[@]}"; do
        kill "$pid" 2>/dev/null || true
    done
    wait 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

echo "== building the step (wasm32-wasip2), stephost, the model server and the receiver" >&2
cargo build -q --release --target wasm32-wasip2 --target-dir target/guest-wasm -p agent-refund
cargo build -q -p stephost -p model-server -p supplier-receiver
bin="${CARGO_TARGET_DIR:-$root/target}/debug"
module="target/guest-wasm/wasm32-wasip2/release/agent_refund.wasm"

# Starts a server in the background (in this shell, so that `cleanup` stops
# it) and sets `url` to the address it says it listens on.
start() {
    local name="$1" log="$work/$1.log"
    shift
    "$@" >"$log" 2>&1 &
    pids+=("$!")
    url=""
    for _ in $(seq 1 100); do
        url="$(grep -o 'listening on http://[0-9.:]*' "$log" | head -n1 | sed 's/listening on //')" || true
        [[ -n "$url" ]] && return
        sleep 0.1
    done
    echo "$name did not start:" >&2
    cat "$log" >&2
    exit 1
}

start receiver "$bin/supplier-receiver" --listen 127.0.0.1:0
receiver="$url"
config="$work/stephost.toml"
sed "s#http://127.0.0.1:8080#$receiver#g" "$config_in" >"$config"
if grep -q '^url = "http://127.0.0.1:8081"' "$config"; then
    start model-server "$bin/model-server" --listen 127.0.0.1:0
    model_server="$url"
    sed -i "s#http://127.0.0.1:8081#$model_server#g" "$config"
    # The scripted server takes any key; never send a real one to it.
    key_env="$(sed -n 's/^key_env = "\([A-Za-z0-9_]*\)".*/\1/p' "$config" | head -n1)"
    [[ -n "$key_env" ]] && export "$key_env=sk-scripted-model-server"
    echo "== scripted model server at $model_server, receiver at $receiver" >&2
else
    echo "== model: $(sed -n 's/^url = "\(http[^"]*\)".*/\1/p' "$config" | head -n1) (from $config_in), receiver at $receiver" >&2
fi

stephost() {
    cargo run -q -p stephost -- --config "$config" "$@"
}

run_id="agent-refund-$(date +%s)-$$"
input="$(printf '%s' "$message" | sed 's/\\/\\\\/g; s/"/\\"/g')"
echo "== stephost run $module --run-id $run_id" >&2
echo "   customer: $message" >&2
status=0
stephost run "$module" --run-id "$run_id" --input "{\"message\": \"$input\"}" || status=$?

if [[ $status -eq 7 ]]; then
    echo "== the run waits for a person's approval:" >&2
    stephost approvals >&2
    # The run's row in the listing: RUN SEQ ASKED EXPIRES DETAILS(sha256 prefix) SUBJECT.
    read -r seq sha < <(stephost approvals | awk -v run="$run_id" '$1 == run {
        for (i = 3; i <= NF; i++) if (length($i) == 12 && $i ~ /^[0-9a-f]+$/) { print $2, $i; exit } }') || true
    if [[ -z "$approve_as" ]]; then
        echo "   approve it from another shell while this one waits (Enter stops the servers):" >&2
        echo "     cargo run -q -p stephost -- approve $run_id $seq --details $sha --by YOUR_NAME" >&2
        echo "     cargo run -q -p stephost -- --config $config resume $run_id" >&2
        echo "   or run this script again with --approve-as NAME." >&2
        read -r _ || true
        exit 7
    fi
    echo "== $approve_as approves call $seq (details sha256 $sha...), and the run goes on" >&2
    stephost approve "$run_id" "$seq" --details "$sha" --by "$approve_as" >&2
    status=0
    stephost resume "$run_id" || status=$?
fi
if [[ $status -ne 0 ]]; then
    exit "$status"
fi

echo "== done. What was recorded, and an offline replay (no model, no receiver):" >&2
echo "     cargo run -q -p stephost -- show $run_id" >&2
echo "     cargo run -q -p stephost -- replay $run_id" >&2
