#!/usr/bin/env bash
# The whole test suite, as CI runs it, on a fresh machine with rustup and
# cargo (Debian packages are installed when missing, which needs root):
#
#   scripts/test.sh
#
# 1. the guest toolchains (scripts/guest-toolchains.sh) and PostgreSQL's
#    server programs, which the tests start a throwaway cluster of (in a
#    temporary folder, on 127.0.0.1; stopped when the tests end). Set
#    STEPHOST_TEST_POSTGRES=postgres://USER@HOST:PORT/DB to use a server of
#    your own instead (the user must be able to create schemas);
# 2. `cargo test --workspace`: unit tests, the conformance suite on every
#    backend, and the end-to-end suite on SQLite;
# 3. the end-to-end suite again, on PostgreSQL.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/guest-toolchains.sh

if [ -z "${STEPHOST_TEST_POSTGRES:-}" ] && [ -z "${STEPHOST_PG_BIN:-}" ] \
    && ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then
    echo "== PostgreSQL: apt-get install postgresql"
    if [ "$(id -u)" -ne 0 ]; then
        echo "error: PostgreSQL is missing and installing it needs root:" >&2
        echo "  apt-get install -y postgresql" >&2
        exit 1
    fi
    export DEBIAN_FRONTEND=noninteractive
    # Installed, not started: the tests run clusters of their own.
    policy=/usr/sbin/policy-rc.d
    made_policy=false
    if [ ! -e "$policy" ]; then
        printf '#!/bin/sh\nexit 101\n' > "$policy"
        chmod +x "$policy"
        made_policy=true
    fi
    apt-get update -qq
    apt-get install -y -qq postgresql >/dev/null
    if $made_policy; then rm -f "$policy"; fi
fi

rustup target add wasm32-wasip2
cargo test --workspace
echo "== the end-to-end suite on PostgreSQL"
STEPHOST_TEST_LEDGER=postgres cargo test -p stephost-tests --test e2e
