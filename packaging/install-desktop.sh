#!/usr/bin/env bash
# Install the launcher and the icon set for the current user (Linux, freedesktop.org).
#   packaging/install-desktop.sh            # into ~/.local/share
#   PREFIX=/usr/local packaging/install-desktop.sh   # system-wide (run as root)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$here/.."
prefix="${PREFIX:-$HOME/.local}"
share="$prefix/share"
for size in 16 32 48 64 128 256; do
  install -Dm644 "$root/resources/icons/kvinspect-$size.png" "$share/icons/hicolor/${size}x${size}/apps/kvinspect.png"
done
install -Dm644 "$root/resources/icons/kvinspect.svg" "$share/icons/hicolor/scalable/apps/kvinspect.svg"
install -Dm644 "$here/kvinspect.desktop" "$share/applications/kvinspect.desktop"
command -v update-desktop-database >/dev/null && update-desktop-database "$share/applications" || true
command -v gtk-update-icon-cache >/dev/null && gtk-update-icon-cache -q "$share/icons/hicolor" || true
echo "installed kvinspect.desktop and icons under $share"
