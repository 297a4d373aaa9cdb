#!/bin/sh
# Builds the C supplier-order step as a WASI preview1 *core module* (a
# reactor exporting `run`, importing stephost:step/* and, through wasi-libc,
# wasi_snapshot_preview1).
#
#   examples/c-supplier-order/build.sh OUT.wasm
#
# Needs (Debian 12):
#   apt-get install -y clang lld wasi-libc libclang-rt-14-dev-wasm32
#   cargo install wit-bindgen-cli --version 0.63.0 --locked
# To make a component of it for a host that takes components only:
#   wasm-tools component new OUT.wasm \
#       --adapt wasi_snapshot_preview1=wasi_snapshot_preview1.reactor.wasm -o step.wasm
set -eu

APT="apt-get install -y clang lld wasi-libc libclang-rt-14-dev-wasm32"
WIT_BINDGEN_VERSION=0.63.0
CARGO="cargo install wit-bindgen-cli --version $WIT_BINDGEN_VERSION --locked"

if [ $# -ne 1 ]; then
    echo "usage: $0 OUT.wasm" >&2
    exit 2
fi
OUT=$1
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
SDK=$ROOT/guest-sdk/c
WIT=$ROOT/wit

need() {
    if ! command -v "$1" >/dev/null 2>&1; then
        echo "$0: \`$1\` not found; install it with: $2" >&2
        exit 1
    fi
}
need clang "$APT"
need wasm-ld "$APT"
need wit-bindgen "$CARGO"
case "$(wit-bindgen --version)" in
    *" $WIT_BINDGEN_VERSION"*) ;;
    *)
        echo "$0: wit-bindgen $WIT_BINDGEN_VERSION expected, found \`$(wit-bindgen --version)\`; install it with: $CARGO" >&2
        exit 1
        ;;
esac

TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT INT TERM

# The toolchain may be there without the WASI sysroot or the wasm32 builtins.
echo 'int x(void) { return 0; }' >"$TMP/probe.c"
if ! clang --target=wasm32-wasi -mexec-model=reactor -O2 "$TMP/probe.c" -o "$TMP/probe.wasm" 2>"$TMP/probe.err"; then
    cat "$TMP/probe.err" >&2
    echo "$0: clang cannot build for wasm32-wasi (wasi-libc or libclang-rt-*-dev-wasm32 missing?); install with: $APT" >&2
    exit 1
fi

# Bindings for the `step` world, generated into the temp dir.
if ! wit-bindgen c "$WIT" --world step --out-dir "$TMP/bindings" >"$TMP/wit-bindgen.log" 2>&1; then
    cat "$TMP/wit-bindgen.log" >&2
    exit 1
fi

mkdir -p "$(dirname "$OUT")"
clang --target=wasm32-wasi -mexec-model=reactor -O2 \
    -Wall -Wextra -Werror -Wno-unused-parameter \
    -I "$TMP/bindings" -I "$SDK" \
    -Wl,--strip-debug \
    "$HERE/supplier_order.c" \
    "$SDK/stephost_step.c" "$SDK/stephost_json.c" \
    "$TMP/bindings/step.c" "$TMP/bindings/step_component_type.o" \
    -o "$OUT"
echo "built $OUT ($(wc -c <"$OUT") bytes)"
