#!/usr/bin/env bash
# Builds a Python step into a WebAssembly component: each example's
# build.sh calls this with its own app, world and name.
#
#   guest-sdk/python/build.sh APP_DIR WIT_DIR WORLD STEP_ID OUT.wasm
#
# APP_DIR holds app.py; WIT_DIR and WORLD name the step world it is built
# against (e.g. wit and step); STEP_ID is the step's name@version.
#
# Needs python3 and componentize-py (pinned; see README.md):
#   pip install componentize-py==0.25.1
# COMPONENTIZE_PY may name the componentize-py program (default: from PATH).
# Works from any directory; writes nothing into the source tree (the sources
# are copied into a temporary directory, where Python's __pycache__ and
# componentize-py's work files go).
set -euo pipefail

COMPONENTIZE_PY_VERSION=0.25.1
INSTALL="pip install componentize-py==${COMPONENTIZE_PY_VERSION}"
# Debian's python3 refuses a system-wide pip install (PEP 668): use a venv.
INSTALL_DEBIAN="apt-get install -y python3 python3-venv && python3 -m venv /opt/componentize-py \
&& /opt/componentize-py/bin/pip install componentize-py==${COMPONENTIZE_PY_VERSION} \
&& export PATH=/opt/componentize-py/bin:\$PATH"
CPY="${COMPONENTIZE_PY:-componentize-py}"

if [ $# -ne 5 ] || [ -z "$5" ]; then
    echo "usage: $0 APP_DIR WIT_DIR WORLD STEP_ID OUT.wasm" >&2
    exit 2
fi
app_dir="$(cd "$1" && pwd)"
wit_dir="$(cd "$2" && pwd)"
world="$3"
# The step's declared name@version, written to a `stephost-step` custom
# section: the host pins runs to it (as the Rust SDK's export_step! does).
STEP_ID="$4"
sdk="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

if ! command -v python3 >/dev/null 2>&1; then
    echo "error: python3 not found; install it with: apt-get install -y python3 python3-pip" >&2
    exit 1
fi
if ! command -v "$CPY" >/dev/null 2>&1; then
    echo "error: componentize-py not found ($CPY); install it with: ${INSTALL}" >&2
    echo "  on Debian: ${INSTALL_DEBIAN}" >&2
    exit 1
fi
version="$("$CPY" --version 2>/dev/null | awk '{print $2}')"
if [ "$version" != "$COMPONENTIZE_PY_VERSION" ]; then
    echo "error: componentize-py ${COMPONENTIZE_PY_VERSION} is required, found '${version}'; install it with: ${INSTALL}" >&2
    echo "  on Debian: ${INSTALL_DEBIAN}" >&2
    exit 1
fi

out_dir="$(dirname "$5")"
mkdir -p "$out_dir"
out="$(cd "$out_dir" && pwd)/$(basename "$5")"

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/app" "$work/sdk"
cp "$app_dir/app.py" "$work/app/"
cp "$sdk"/*.py "$work/sdk/"

# The app's imports are resolved from these two directories only: not from
# the site-packages of whatever Python runs componentize-py.
(
    cd "$work"
    unset VIRTUAL_ENV
    "$CPY" -q -d "$wit_dir" -w "$world" componentize \
        -p "$work/app" -p "$work/sdk" app -o "$work/step.wasm"
)

# Append the custom section `stephost-step` (id 0: LEB128 size, LEB128 name
# length, name, content) at the end of the component.
python3 - "$work/step.wasm" "$STEP_ID" <<'EOF'
import sys

def leb(n):
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)

path, step_id = sys.argv[1], sys.argv[2].encode()
name = b"stephost-step"
payload = leb(len(name)) + name + step_id
with open(path, "ab") as f:
    f.write(b"\x00" + leb(len(payload)) + payload)
EOF

mv "$work/step.wasm" "$out"
echo "built $out ($(wc -c <"$out") bytes)"
