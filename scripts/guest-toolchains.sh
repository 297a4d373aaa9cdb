#!/usr/bin/env bash
# Installs the toolchains the non-Rust guests are built with, pinned, from
# Debian, PyPI, npm and crates.io only. Idempotent: what is there already at
# the pinned version is kept. Tools go under target/guest-tools/ (the tests
# and the example READMEs put its bin folders on PATH); Debian packages need
# root, and are only installed when missing.
#
#   scripts/guest-toolchains.sh
#
# - C:          clang, lld, wasi-libc, libclang-rt-14-dev-wasm32 (Debian 12);
#               wit-bindgen 0.63.0 (crates.io wit-bindgen-cli, C generator only)
# - Python:     componentize-py 0.25.1 (PyPI, in a venv)
# - JavaScript: node and npm (Debian, if missing); componentize-qjs 0.4.5
#               (npm, from examples/js-supplier-order/package-lock.json)
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
tools="$root/target/guest-tools"
mkdir -p "$tools"

WIT_BINDGEN_VERSION=0.63.0
COMPONENTIZE_PY_VERSION=0.25.1

missing=()
command -v clang >/dev/null || missing+=(clang)
command -v wasm-ld >/dev/null || missing+=(lld)
[ -f /usr/share/wasi-sysroot/include/stdio.h ] \
    || [ -f /usr/include/wasm32-wasi/stdio.h ] || missing+=(wasi-libc)
ls /usr/lib/llvm-14/lib/clang/14*/lib/wasi/libclang_rt.builtins-wasm32.a >/dev/null 2>&1 \
    || missing+=(libclang-rt-14-dev-wasm32)
command -v node >/dev/null || missing+=(nodejs)
command -v npm >/dev/null || missing+=(npm)
python3 -c 'import venv, ensurepip' 2>/dev/null || missing+=(python3-venv)
if [ ${#missing[@]} -gt 0 ]; then
    echo "== guest toolchains: apt-get install ${missing[*]}"
    if [ "$(id -u)" -ne 0 ]; then
        echo "error: these Debian packages are missing and installing them needs root:" >&2
        echo "  apt-get install -y ${missing[*]}" >&2
        exit 1
    fi
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq "${missing[@]}" >/dev/null
fi

if [ "$("$tools/bin/wit-bindgen" --version 2>/dev/null | awk '{print $2}')" != "$WIT_BINDGEN_VERSION" ]; then
    echo "== guest toolchains: wit-bindgen $WIT_BINDGEN_VERSION (cargo install, C generator only)"
    cargo install --quiet --root "$tools" wit-bindgen-cli --version "$WIT_BINDGEN_VERSION" \
        --locked --no-default-features --features c
fi

if [ "$("$tools/py/bin/componentize-py" --version 2>/dev/null | awk '{print $2}')" != "$COMPONENTIZE_PY_VERSION" ]; then
    echo "== guest toolchains: componentize-py $COMPONENTIZE_PY_VERSION (venv)"
    python3 -m venv "$tools/py"
    "$tools/py/bin/pip" install --quiet --disable-pip-version-check \
        "componentize-py==$COMPONENTIZE_PY_VERSION"
fi

if [ ! -f "$root/examples/js-supplier-order/node_modules/componentize-qjs/cli.mjs" ]; then
    echo "== guest toolchains: componentize-qjs (npm ci)"
    (cd "$root/examples/js-supplier-order" && npm ci --no-audit --no-fund --silent)
fi

echo "== guest toolchains ready: $tools/bin, $tools/py/bin"
