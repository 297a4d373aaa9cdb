#!/usr/bin/env bash
# Builds the Python fan-out test guest (stephost:step@0.3.0) into a component.
#
#   tests/guests/python-fanout/build.sh OUT.wasm
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../../.." && pwd)"
exec "$root/guest-sdk/python/build.sh" "$here" "$root/wit/0.3.0" step python-fanout@0.1.0 "${1:-}"
