"""Render the PNG icon set from kvinspect.svg (run after editing the SVG master).

    QT_QPA_PLATFORM=offscreen python resources/icons/render_icons.py
"""

from pathlib import Path

from PySide6 import QtCore, QtGui, QtSvg, QtWidgets

HERE = Path(__file__).parent
PKG = HERE.parent.parent / "kvinspect" / "resources" / "icons"
SIZES = (16, 32, 48, 64, 128, 256)


def main() -> None:
    QtWidgets.QApplication.instance() or QtGui.QGuiApplication([])
    renderer = QtSvg.QSvgRenderer(str(HERE / "kvinspect.svg"))
    PKG.mkdir(parents=True, exist_ok=True)
    for size in SIZES:
        img = QtGui.QImage(size, size, QtGui.QImage.Format.Format_ARGB32)
        img.fill(QtCore.Qt.GlobalColor.transparent)
        p = QtGui.QPainter(img)
        p.setRenderHint(QtGui.QPainter.RenderHint.Antialiasing)
        renderer.render(p)
        p.end()
        for folder in (HERE, PKG):
            img.save(str(folder / f"kvinspect-{size}.png"))
    (PKG / "kvinspect.svg").write_bytes((HERE / "kvinspect.svg").read_bytes())


if __name__ == "__main__":
    main()
