#!/usr/bin/env bash
# Builds the Python HTTP supplier-order step into a WebAssembly component,
# against the step world with wasi:http (guest-sdk/python/wit-http).
#
#   examples/python-http-supplier-order/build.sh OUT.wasm
#
# Needs python3 and componentize-py 0.25.1 (see README.md); the build itself
# is guest-sdk/python/build.sh's.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
exec "$root/guest-sdk/python/build.sh" "$here" "$root/guest-sdk/python/wit-http" step-http \
    python-http-supplier-order@0.1.0 "${1:-}"
