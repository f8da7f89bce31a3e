#!/usr/bin/env bash
# The frozen app (make bundle) runs on its own: it starts offscreen, loads tiny-llama, runs one turn
# in the window (its engine is the bundle itself, `kvinspect engine`), saves a screenshot, exits 0.
#   packaging/smoke_bundle.sh [BUNDLE_DIR]       # default: dist/bundle/kvinspect
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
bundle="$(cd "${1:-$repo/dist/bundle/kvinspect}" && pwd)"
app="$bundle/kvinspect"
[ -x "$app" ] || { echo "smoke_bundle: no frozen app at $app (make bundle)" >&2; exit 2; }
work="$(mktemp -d -t kvinspect-bundle-XXXXXX)"
if [ "${KEEP:-}" = 1 ]; then echo "smoke_bundle: keeping $work"; else trap 'rm -rf "$work"' EXIT; fi
t0=$(date +%s)
# Nothing from a venv or the checkout: the bundle carries its own Python and packages.
unset PYTHONPATH PYTHONHOME VIRTUAL_ENV
cd "$work"
export KVINSPECT_CONFIG_DIR="$work/config" QT_QPA_PLATFORM=offscreen PATH=/usr/bin:/bin
"$app" --version
cat >script.json <<'JSON'
{"turns": ["Hello! What does a KV cache store?"], "max_new_tokens": 8, "seed": 0}
JSON
"$app" --model tiny-llama --script script.json --screenshot window.png --exit-when-done
test -s window.png
echo "smoke_bundle: window + engine, one turn, screenshot $(du -k window.png | cut -f1) KiB ($(( $(date +%s) - t0 )) s)"
if [ -n "${SCREENSHOT_OUT:-}" ]; then cp window.png "$SCREENSHOT_OUT"; fi
echo "smoke_bundle: ok ($(du -sh "$bundle" | cut -f1) bundle)"
