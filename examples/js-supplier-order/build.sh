#!/usr/bin/env bash
# Builds the JavaScript supplier-order step into a stephost component.
#
#     examples/js-supplier-order/build.sh OUT.wasm
#
# Needs node (>= 18) and npm: `apt-get install -y nodejs npm` on Debian. The
# pinned componentize-qjs comes from npm: `npm ci` runs in this folder when
# its node_modules is missing. The sources are copied to a temporary folder
# and built there (QuickJS, non-async runtime: `--sync`); the output gets the
# step's declared name@version from package.json.
set -euo pipefail

if [ $# -ne 1 ]; then
    echo "usage: $0 OUT.wasm" >&2
    exit 2
fi
out=$1
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)

for tool in node npm; do
    if ! command -v "$tool" >/dev/null 2>&1; then
        echo "build.sh: $tool is missing; install it with: apt-get install -y nodejs npm" >&2
        exit 1
    fi
done
major=$(node -p 'process.versions.node.split(".")[0]')
if [ "$major" -lt 18 ]; then
    echo "build.sh: node $(node --version) is too old (>= 18 needed); install it with: apt-get install -y nodejs npm" >&2
    exit 1
fi

if [ ! -d "$here/node_modules" ]; then
    echo "build.sh: installing the pinned build tools (npm ci in $here)" >&2
    (cd "$here" && npm ci --no-audit --no-fund)
fi
# Its cli.mjs, not bin/componentize-qjs: that file has no extension and uses
# `import`, which node before 20.19 reads as CommonJS and refuses.
cqjs=$here/node_modules/componentize-qjs/cli.mjs
if [ ! -f "$cqjs" ]; then
    echo "build.sh: $cqjs is missing; reinstall with: (cd $here && rm -rf node_modules && npm ci)" >&2
    exit 1
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# The app imports the helper by its path in the repository: keep that layout,
# and expose only these two files to the build (its module root).
mkdir -p "$work/src/examples/js-supplier-order" "$work/src/guest-sdk/js"
cp "$here/app.js" "$work/src/examples/js-supplier-order/"
cp "$root/guest-sdk/js/stephost-step.js" "$work/src/guest-sdk/js/"

node "$cqjs" --wit "$root/wit" --world step --sync \
    --module-root "$work/src" --js "$work/src/examples/js-supplier-order/app.js" \
    -o "$work/step.wasm" >"$work/log" 2>&1 || { cat "$work/log" >&2; exit 1; }

step=$(cd "$here" && node -p 'const p = require("./package.json"); p.name + "@" + p.version')
mkdir -p "$(dirname "$out")"
node "$root/guest-sdk/js/declare-step.mjs" "$work/step.wasm" "$work/out.wasm" "$step"
mv "$work/out.wasm" "$out"
echo "build.sh: wrote $out ($(wc -c <"$out") bytes, step $step)" >&2
