#!/usr/bin/env bash
# The built wheel, installed into a fresh venv that cannot see the checkout, runs the smoke test:
# --version, models, a run on tiny-llama, a report of it, the window offscreen with --screenshot.
#   packaging/smoke_wheel.sh [DIST_DIR]         # default: ./dist (python -m build)
# TORCH: what pip installs torch from before the wheel (default torch==2.13.0, the CPU build where
# pip's index/find-links give it; TORCH='torch --index-url https://download.pytorch.org/whl/cpu'
# elsewhere). The venv must end up without CUDA wheels (nvidia-*): that is checked.
# KEEP=1 keeps the temporary folder (venv, run, report, screenshot) and prints where it is.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
dist="$(cd "${1:-$repo/dist}" && pwd)"
python="${PYTHON:-python3}"
torch_req="${TORCH:-torch==2.13.0}"
wheels=("$dist"/kvinspect-*.whl)
[ -f "${wheels[0]}" ] || { echo "smoke_wheel: no kvinspect wheel in $dist (run python -m build)" >&2; exit 2; }
work="$(mktemp -d -t kvinspect-wheel-XXXXXX)"
if [ "${KEEP:-}" = 1 ]; then echo "smoke_wheel: keeping $work"; else trap 'rm -rf "$work"' EXIT; fi
t0=$(date +%s)
step() { echo "smoke_wheel: $* ($(( $(date +%s) - t0 )) s)"; }

# No PYTHONPATH, and a working folder outside the checkout: only the installed package is importable.
unset PYTHONPATH
cd "$work"
"$python" -m venv venv
# shellcheck disable=SC2086  # TORCH may carry pip options (--index-url ...)
# --no-compile: byte-compiling torch and transformers at install is most of the CPU time; the smoke runs once.
venv/bin/python -m pip install -q --no-compile $torch_req
venv/bin/python -m pip install -q --no-compile "${wheels[0]}"
step "installed $(basename "${wheels[0]}") ($(du -k "${wheels[0]}" | cut -f1) KiB)"
if venv/bin/python -m pip list 2>/dev/null | grep -i '^nvidia-'; then
  echo "smoke_wheel: the CPU install pulled CUDA wheels (above)" >&2; exit 1
fi
where="$(venv/bin/python -c 'import kvinspect, os; print(os.path.dirname(kvinspect.__file__))')"
case "$where" in
  "$work"/venv/*) ;;
  *) echo "smoke_wheel: kvinspect imported from $where, not the fresh venv" >&2; exit 1 ;;
esac
export PATH="$work/venv/bin:$PATH" KVINSPECT_CONFIG_DIR="$work/config" QT_QPA_PLATFORM=offscreen

kvinspect --version
kvinspect models >models.txt && grep -q tiny-llama models.txt
step "--version, models"
cat >script.json <<'JSON'
{"turns": ["Hello! What does a KV cache store?", "And after a second turn?"], "max_new_tokens": 8, "seed": 0}
JSON
kvinspect run --model tiny-llama --script script.json --out run >run.txt
test -s run/trace.jsonl && test -s run/summary.json
step "run on tiny-llama"
kvinspect report run --out report >/dev/null
test -s report/report.md && test -s report/cache.png
step "report"
kvinspect gui --model tiny-gemma3 --script script.json --screenshot window.png --exit-when-done
venv/bin/python - <<'PY'
from PySide6 import QtGui
img = QtGui.QImage("window.png")
assert img.width() >= 640 and img.height() >= 480, (img.width(), img.height())
PY
step "window offscreen, screenshot $(du -k window.png | cut -f1) KiB"
echo "smoke_wheel: ok"
