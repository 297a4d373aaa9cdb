#!/usr/bin/env bash
# Makes a frozen set of today's ledger format in tests/frozen/DAY/: read
# tests/frozen/README.md first. A frozen set is never made again; a new
# format gets a new set beside the old ones.
#
#   cargo build -p supplier-receiver
#   cargo test -p stephost-tests --test e2e --no-run
#   tests/frozen/make.sh YYYY-MM-DD
#
# The first two commands build what it runs: the CLI with crash points
# (target/debug/stephost-crash; they fire only when STEPHOST_CRASH_AT is
# set), the supplier step (examples/supplier-order) and the supplier's HTTP
# API (examples/supplier-receiver). It also needs sqlite3.
set -euo pipefail
cd "$(dirname "$0")/../.."

day=${1:?usage: tests/frozen/make.sh YYYY-MM-DD}
out=tests/frozen/$day
if [ -e "$out" ]; then
    echo "error: $out exists, and a frozen set is never made again (tests/frozen/README.md)" >&2
    exit 1
fi
stephost=$PWD/target/debug/stephost-crash
receiver=$PWD/target/debug/supplier-receiver
step=$PWD/target/guest-wasm/wasm32-wasip2/release/supplier_order.wasm
for file in "$stephost" "$receiver" "$step"; do
    if [ ! -f "$file" ]; then
        echo "error: $file is not built; see the top of $0" >&2
        exit 1
    fi
done
command -v sqlite3 >/dev/null || { echo "error: sqlite3 is needed" >&2; exit 1; }

work=$(mktemp -d)
port=${FROZEN_RECEIVER_PORT:-18765}
"$receiver" --listen "127.0.0.1:$port" --quiet &
receiver_pid=$!
trap 'kill "$receiver_pid" 2>/dev/null || true; rm -rf "$work"' EXIT
for _ in $(seq 100); do
    if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then break; fi
    sleep 0.1
done

mkdir -p "$out"
printf 'TEST-ONLY chain key of a frozen ledger: public, never sign a real ledger with it\n' \
    > "$out/TEST-ONLY-chain.key"
install -m 600 "$out/TEST-ONLY-chain.key" "$work/chain.key"

# The supplier over HTTP, as examples/supplier-order/stephost-http.toml has it.
url=http://127.0.0.1:$port
cat > "$work/stephost.toml" <<EOF
[effects."inventory.read"]
kind = "http"
class = "read"
method = "GET"
url = "$url/inventory/{sku}"

[effects."supplier.order"]
kind = "http"
class = "write"
method = "POST"
url = "$url/orders"
idempotent = true
lookup = "$url/orders/{operation_id}"
retry = { attempts_max = 5, backoff_first_ms = 50, backoff_max_ms = 2000 }
EOF
# The same, but the order can neither be sent again nor looked up: after a
# crash once it was sent, its outcome is unknown.
cat > "$work/no-lookup.toml" <<EOF
[effects."inventory.read"]
kind = "http"
class = "read"
method = "GET"
url = "$url/inventory/{sku}"

[effects."supplier.order"]
kind = "http"
class = "write"
method = "POST"
url = "$url/orders"
idempotent = false
EOF

export STEPHOST_LEDGER=sqlite:$work/ledger.db
export STEPHOST_CONFIG=$work/stephost.toml
export STEPHOST_CHAIN_KEY_FILE=$work/chain.key
export STEPHOST_CACHE_DIR=off
unset STEPHOST_DB STEPHOST_CHAIN_KEY STEPHOST_CRASH_AT

# Runs a command and insists on its exit code.
expect() {
    local want=$1 got=0
    shift
    "$@" || got=$?
    if [ "$got" -ne "$want" ]; then
        echo "error: $* exited $got, not $want" >&2
        exit 1
    fi
}

# order-completed: the supplier order, sent and completed.
expect 0 "$stephost" run "$step" --input '{"sku":"WIDGET-7","quantity":10}' \
    --run-id order-completed
# order-parked: the process dies (SIGABRT, 134) once the order was sent;
# resuming cannot tell whether the supplier has it: parked (5).
expect 134 env STEPHOST_CONFIG="$work/no-lookup.toml" STEPHOST_CRASH_AT=after-send@4 \
    "$stephost" run "$step" --input '{"sku":"GADGET-2","quantity":10}' --run-id order-parked
expect 5 env STEPHOST_CONFIG="$work/no-lookup.toml" "$stephost" resume order-parked
# order-waiting: the order waits for a person's approval (7), for ten years.
expect 7 "$stephost" run "$step" \
    --input '{"sku":"WIDGET-7","quantity":12,"approval_ttl_seconds":315360000}' \
    --run-id order-waiting

for run in order-completed order-parked order-waiting; do
    expect 0 "$stephost" verify "$run"
done
"$stephost" export order-completed > "$out/order-completed.json"
"$stephost" runs
# One self-contained file: the write-ahead log folded in, no free pages.
# (Nothing opens the copy in tests/frozen afterwards: stephost would turn its
# write-ahead log back on.)
sqlite3 "$work/ledger.db" 'PRAGMA wal_checkpoint(TRUNCATE); PRAGMA journal_mode=DELETE; VACUUM;' \
    >/dev/null
test "$(sqlite3 "$work/ledger.db" 'PRAGMA integrity_check;')" = ok
cp "$work/ledger.db" "$out/ledger.sqlite"
ls -l "$out"
