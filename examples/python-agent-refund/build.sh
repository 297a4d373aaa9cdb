#!/usr/bin/env bash
# Builds the Python refund agent step (stephost:step@0.2.0) into a WebAssembly component.
#
#   examples/python-agent-refund/build.sh OUT.wasm
#
# Needs python3 and componentize-py 0.25.1 (see README.md); the build itself
# is guest-sdk/python/build.sh's.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
# The world is stephost:step@0.2.0 (wit/0.2.0: the 0.1.0 interfaces plus
# `models`).
"$root/guest-sdk/python/build.sh" "$here" "$root/wit/0.2.0" step python-agent-refund@0.1.0 "${1:-}"

# The component must import the 0.2.0 models interface (a build against the
# 0.1.0 WIT would have no `chat`).
if ! grep -q -a -F 'stephost:step/models@0.2.0' "$1"; then
    echo "error: the component does not import stephost:step/models@0.2.0" >&2
    exit 1
fi
