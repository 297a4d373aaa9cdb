#!/bin/sh
# Builds the C command test guest: a WASI preview1 core module exporting
# `_start` (no stephost imports).
#
#   tests/guests/c-command/build.sh OUT.wasm
#
# Needs (Debian 12):  apt-get install -y clang lld wasi-libc libclang-rt-14-dev-wasm32
set -eu

INSTALL="apt-get install -y clang lld wasi-libc libclang-rt-14-dev-wasm32"
if [ $# -ne 1 ]; then
    echo "usage: $0 OUT.wasm" >&2
    exit 2
fi
OUT=$1
HERE=$(cd "$(dirname "$0")" && pwd)

need() {
    if ! command -v "$1" >/dev/null 2>&1; then
        echo "$0: \`$1\` not found; install it with: $INSTALL" >&2
        exit 1
    fi
}
need clang
need wasm-ld

TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT INT TERM

# The toolchain may be there without the WASI sysroot or the wasm32 builtins.
echo 'int main(void) { return 0; }' >"$TMP/probe.c"
if ! clang --target=wasm32-wasi -O2 "$TMP/probe.c" -o "$TMP/probe.wasm" 2>"$TMP/probe.err"; then
    cat "$TMP/probe.err" >&2
    echo "$0: clang cannot build for wasm32-wasi (wasi-libc or libclang-rt-*-dev-wasm32 missing?); install with: $INSTALL" >&2
    exit 1
fi

mkdir -p "$(dirname "$OUT")"
clang --target=wasm32-wasi -O2 -Wall -Wextra -Werror \
    -Wl,--strip-debug \
    "$HERE/main.c" -o "$OUT"
echo "built $OUT ($(wc -c <"$OUT") bytes)"
