#!/usr/bin/env bash
# Builds the Python supplier-order step into a WebAssembly component.
#
#   examples/python-supplier-order/build.sh OUT.wasm
#
# Needs python3 and componentize-py 0.25.1 (see README.md); the build itself
# is guest-sdk/python/build.sh's.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
exec "$root/guest-sdk/python/build.sh" "$here" "$root/wit" step python-supplier-order@0.1.0 "${1:-}"
