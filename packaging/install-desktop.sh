#!/usr/bin/env bash
# Add kvinspect to the desktop menu for the current user (Linux, freedesktop.org), or take it out.
#   packaging/install-desktop.sh                  # into ${XDG_DATA_HOME:-~/.local/share}
#   packaging/install-desktop.sh --uninstall      # remove exactly what the line above installed
#   PREFIX=/usr/local packaging/install-desktop.sh   # system-wide, into $PREFIX/share (run as root)
# The icons are the ones the package ships (kvinspect/resources/icons), at every size found there.
# The launcher runs `kvinspect` from PATH (uv tool install / pipx put it in ~/.local/bin).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
icons="${KVINSPECT_ICONS:-$here/../kvinspect/resources/icons}"
if [ -n "${PREFIX:-}" ]; then share="$PREFIX/share"; else share="${XDG_DATA_HOME:-$HOME/.local/share}"; fi
mode=install
case "${1:-}" in
  "") ;;
  --uninstall) mode=uninstall ;;
  -h|--help) sed -n '2,7p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  *) echo "install-desktop.sh: unknown option $1 (use --uninstall or --help)" >&2; exit 2 ;;
esac
[ -d "$icons" ] || { echo "install-desktop.sh: no icon folder $icons" >&2; exit 2; }

targets=()  # "source destination" pairs: the one list both directions walk
shopt -s nullglob
for png in "$icons"/kvinspect-*.png; do
  size="$(basename "$png" .png)"; size="${size#kvinspect-}"
  [[ "$size" =~ ^[0-9]+$ ]] || continue
  targets+=("$png|$share/icons/hicolor/${size}x${size}/apps/kvinspect.png")
done
[ -f "$icons/kvinspect.svg" ] && targets+=("$icons/kvinspect.svg|$share/icons/hicolor/scalable/apps/kvinspect.svg")
targets+=("$here/kvinspect.desktop|$share/applications/kvinspect.desktop")

for t in "${targets[@]}"; do
  src="${t%%|*}"; dst="${t#*|}"
  if [ "$mode" = install ]; then
    install -Dm644 "$src" "$dst"
  else
    rm -f "$dst"
    # Only the folders that are empty now (the size and apps folders this script may have made).
    rmdir "$(dirname "$dst")" 2>/dev/null && rmdir "$(dirname "$(dirname "$dst")")" 2>/dev/null || true
  fi
done
if command -v update-desktop-database >/dev/null && [ -d "$share/applications" ]; then
  update-desktop-database -q "$share/applications" || true
fi
if command -v gtk-update-icon-cache >/dev/null && [ -f "$share/icons/hicolor/index.theme" ]; then
  gtk-update-icon-cache -q "$share/icons/hicolor" || true
fi
if [ "$mode" = install ]; then
  echo "installed kvinspect.desktop and $(( ${#targets[@]} - 1 )) icons under $share"
else
  echo "removed kvinspect.desktop and its icons from $share"
fi
