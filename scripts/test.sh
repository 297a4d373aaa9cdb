#!/usr/bin/env bash
# The whole test suite, as CI runs it, on a fresh machine with rustup and
# cargo (Debian packages are installed when missing, which needs root):
#
#   scripts/test.sh
#
# 1. the guest toolchains (scripts/guest-toolchains.sh), PostgreSQL's
#    server programs, which the tests start a throwaway cluster of (in a
#    temporary folder, on 127.0.0.1; stopped when the tests end), and
#    Chromium with playwright-core for the console's browser tests. Set
#    STEPHOST_TEST_POSTGRES=postgres://USER@HOST:PORT/DB to use a server of
#    your own instead (the user must be able to create schemas), and
#    STEPHOST_CHROMIUM=PATH for a Chromium of your own; and schemathesis
#    (PyPI, pinned, in a venv under target/schemathesis) for the API's
#    contract test; and the Python `mcp` package (PyPI, pinned, in
#    target/mcp-venv) for the MCP tests' server;
# 2. `cargo test --workspace`: unit tests, the conformance suite on every
#    backend, and the end-to-end suite on SQLite;
# 3. the end-to-end suite again, on PostgreSQL.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/guest-toolchains.sh

# Installs Debian packages (root only), without starting any service they
# bring: the tests start what they need themselves.
apt_install() {
    echo "== apt-get install $*"
    if [ "$(id -u)" -ne 0 ]; then
        echo "error: these Debian packages are missing and installing them needs root:" >&2
        echo "  apt-get install -y $*" >&2
        exit 1
    fi
    export DEBIAN_FRONTEND=noninteractive
    policy=/usr/sbin/policy-rc.d
    made_policy=false
    if [ ! -e "$policy" ]; then
        printf '#!/bin/sh\nexit 101\n' > "$policy"
        chmod +x "$policy"
        made_policy=true
    fi
    apt-get update -qq
    apt-get install -y -qq "$@" >/dev/null
    if $made_policy; then rm -f "$policy"; fi
}

if [ -z "${STEPHOST_TEST_POSTGRES:-}" ] && [ -z "${STEPHOST_PG_BIN:-}" ] \
    && ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then
    apt_install postgresql
fi

# The console's browser tests: Debian's Chromium, driven by playwright-core
# (npm, pinned by tests/browser/package-lock.json).
if [ -z "${STEPHOST_CHROMIUM:-}" ] && [ ! -x /usr/bin/chromium ]; then
    apt_install chromium
fi
echo "== browser tests: npm ci (playwright-core)"
npm ci --prefix tests/browser --no-audit --no-fund --loglevel=error

# The API's contract test (tests/tests/e2e/server.rs): schemathesis from PyPI,
# pinned, in a venv of its own. The test fails if it is missing.
SCHEMATHESIS_VERSION=4.32.5
schemathesis_venv=target/schemathesis
if [ "$("$schemathesis_venv/bin/schemathesis" --version 2>/dev/null | awk '{print $3}')" != "$SCHEMATHESIS_VERSION" ]; then
    echo "== contract test: schemathesis $SCHEMATHESIS_VERSION (venv)"
    python3 -m venv "$schemathesis_venv"
    "$schemathesis_venv/bin/pip" install --quiet --disable-pip-version-check \
        "schemathesis==$SCHEMATHESIS_VERSION"
fi

# The MCP tests' server (examples/mcp-supplier-order/supplier_server.py):
# the Python `mcp` package from PyPI, pinned, in a venv of its own.
MCP_VERSION=2.3.0
mcp_venv=target/mcp-venv
if ! "$mcp_venv/bin/python3" -c "import importlib.metadata as m, sys; sys.exit(m.version('mcp') != '$MCP_VERSION')" 2>/dev/null; then
    echo "== MCP tests: mcp $MCP_VERSION (venv)"
    python3 -m venv "$mcp_venv"
    "$mcp_venv/bin/pip" install --quiet --disable-pip-version-check "mcp==$MCP_VERSION"
fi

rustup target add wasm32-wasip2
cargo test --workspace
echo "== the end-to-end suite on PostgreSQL"
# `--workspace`, as above: a `-p` selection unifies the crates' features
# otherwise and builds wasmtime and the host again.
STEPHOST_TEST_LEDGER=postgres cargo test --workspace --test e2e
