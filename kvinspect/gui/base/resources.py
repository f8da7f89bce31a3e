"""Icons and stylesheets: package data found via importlib.resources (works installed and frozen)."""

from __future__ import annotations

from importlib.resources import files

from PySide6 import QtGui


def resource_path(name: str):
    return files("kvinspect") / "resources" / name


def app_icon() -> QtGui.QIcon:
    icon = QtGui.QIcon()
    for size in (16, 32, 48, 64, 128, 256):
        p = resource_path(f"icons/kvinspect-{size}.png")
        if p.is_file():
            icon.addFile(str(p), QtCore_size(size))
    svg = resource_path("icons/kvinspect.svg")
    if svg.is_file():
        icon.addFile(str(svg))
    return icon


def QtCore_size(n: int):
    from PySide6.QtCore import QSize

    return QSize(n, n)
