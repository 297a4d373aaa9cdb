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
#   examples/agent-refund/run.sh --parallel --approve-as ana
#                                                     # two orders looked up at once, then refunded
#                                                     # at once, each tool call a child run; ana
#                                                     # approves the $250.00 one
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
parallel=false
while [[ "${1:-}" == --* ]]; do
    case "$1" in
        --approve-as) approve_as="${2:?--approve-as needs a name}"; shift 2 ;;
        --parallel) parallel=true; shift ;;
        *) echo "unknown option $1" >&2; exit 2 ;;
    esac
done
default_message="Hi, I'd like a refund for order A-1001: the blender arrived broken. Thanks, Sam"
if $parallel; then
    default_message="Please refund my orders A-1001 (arrived broken) and A-1002 (never arrived). Sam"
fi
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
    script=()
    if $parallel; then
        script=(--script "$here/parallel-script.json")
    fi
    start model-server "$bin/model-server" --listen 127.0.0.1:0 "${script[@]}"
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

if $parallel; then
    # Each tool call is a child run of this same step, by name.
    printf '\n[steps.agent-refund]\nmodule = "%s"\n' "$root/$module" >>"$config"
fi

run_id="agent-refund-$(date +%s)-$$"
input="$(printf '%s' "$message" | sed 's/\\/\\\\/g; s/"/\\"/g')"
echo "== stephost run $module --run-id $run_id" >&2
echo "   customer: $message" >&2
status=0
if $parallel; then
    stephost run "$module" --run-id "$run_id" --input "{\"message\": \"$input\", \"parallel\": true}" || status=$?
else
    stephost run "$module" --run-id "$run_id" --input "{\"message\": \"$input\"}" || status=$?
fi

# Approves what waits for a person (with --approve-as), or says how to and
# exits 7.
approve_waiting() {
    # The listing's rows: RUN SEQ ASKED EXPIRES DETAILS(sha256 prefix) SUBJECT.
    local rows
    rows="$(stephost approvals | awk 'NR > 1 && $1 != "" {
        for (i = 3; i <= NF; i++) if (length($i) == 12 && $i ~ /^[0-9a-f]+$/) { print $1, $2, $i; break } }')" || true
    [[ -z "$rows" ]] && return 0
    echo "== a run waits for a person's approval:" >&2
    stephost approvals >&2
    if [[ -z "$approve_as" ]]; then
        while read -r run seq sha; do
            echo "   approve it from another shell while this one waits (Enter stops the servers):" >&2
            echo "     cargo run -q -p stephost -- approve $run $seq --details $sha --by YOUR_NAME" >&2
        done <<<"$rows"
        echo "     cargo run -q -p stephost -- --config $config worker --exit-when-idle" >&2
        echo "   or run this script again with --approve-as NAME." >&2
        read -r _ || true
        exit 7
    fi
    while read -r run seq sha; do
        echo "== $approve_as approves call $seq of $run (details sha256 $sha...)" >&2
        stephost approve "$run" "$seq" --details "$sha" --by "$approve_as" >&2
    done <<<"$rows"
}

if $parallel && [[ $status -eq 7 ]]; then
    # The parent waits for its children: a worker runs them (and the parent
    # again once they end) until the parent has ended.
    while :; do
        stephost worker --exit-when-idle >&2
        if ! stephost tree "$run_id" | head -n1 | grep -q "^$run_id waiting"; then
            break
        fi
        approve_waiting
    done
    echo "== the tree of runs:" >&2
    stephost tree "$run_id" >&2
    status=0
    stephost resume "$run_id" || status=$?
elif [[ $status -eq 7 ]]; then
    approve_waiting
    status=0
    stephost resume "$run_id" || status=$?
fi
if [[ $status -ne 0 ]]; then
    exit "$status"
fi

echo "== done. What was recorded, and an offline replay (no model, no receiver):" >&2
echo "     cargo run -q -p stephost -- show $run_id" >&2
echo "     cargo run -q -p stephost -- replay $run_id" >&2
