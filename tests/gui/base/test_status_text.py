"""StatusText (gui/base/status_text.py): a status-bar text set at every paint of a stream repaints
itself only: no layout of the status bar or the main window, no repaint behind it."""

from __future__ import annotations

import collections

from PySide6 import QtCore, QtGui, QtTest, QtWidgets

from kvinspect.gui.base.status_text import StatusText


class _Events(QtCore.QObject):
    def __init__(self):
        super().__init__()
        self.seen: collections.Counter = collections.Counter()

    def eventFilter(self, obj, ev):  # noqa: N802 - Qt's name
        if ev.type() in (QtCore.QEvent.Type.LayoutRequest, QtCore.QEvent.Type.Paint):
            self.seen[(type(obj).__name__, ev.type().name)] += 1
        return False


def _window(qtbot, label):
    w = QtWidgets.QMainWindow()
    qtbot.addWidget(w)
    w.setCentralWidget(QtWidgets.QTextEdit())
    w.statusBar().addPermanentWidget(label)
    w.statusBar().addPermanentWidget(QtWidgets.QLabel("trace.jsonl"))
    w.resize(800, 300)
    w.show()
    qtbot.waitExposed(w)
    return w


def _settle(app) -> None:
    """Run the event loop until it has painted and laid out nothing for 50 ms: the window's first
    exposure, and what earlier calls posted, come a frame or more later and are not counted."""
    quiet = 0
    for _ in range(200):
        events = _Events()
        app.installEventFilter(events)
        app.sendPostedEvents()
        app.processEvents()
        QtTest.QTest.qWait(10)
        app.removeEventFilter(events)
        quiet = 0 if events.seen else quiet + 1
        if quiet >= 5:
            return


def _count(app, label, texts):
    _settle(app)
    events = _Events()
    app.installEventFilter(events)
    key = (type(label).__name__, "Paint")
    for t in texts:
        before = events.seen[key]
        label.setText(t)
        # Qt delivers a window's repaint at its next frame (requestUpdate, up to a screen refresh later):
        # wait for the label's paint so that each text is painted, not a fast loop's last one only.
        for _ in range(200):
            app.sendPostedEvents()
            app.processEvents()
            if events.seen[key] > before:
                break
            QtTest.QTest.qWait(1)
    app.removeEventFilter(events)
    return events.seen


def test_a_new_text_of_no_greater_width_repaints_the_text_only(qtbot):
    app = QtWidgets.QApplication.instance()
    label = StatusText()
    w = _window(qtbot, label)
    label.setText("1,000 steps · 2 turns")
    app.processEvents()
    seen = _count(app, label, [f"{n:,} steps · 2 turns" for n in range(1_001, 1_041)])
    assert seen[("StatusText", "Paint")] >= 40, seen
    assert not [k for k in seen if k[1] == "LayoutRequest"], seen
    assert seen[("QMainWindow", "Paint")] == 0 and seen[("QStatusBar", "Paint")] == 0, seen
    # A QLabel in its place lays the status bar and the window out at every text (what this replaces).
    qlabel = QtWidgets.QLabel("1,000 steps · 2 turns")
    w.statusBar().addPermanentWidget(qlabel)
    app.processEvents()
    seen = _count(app, qlabel, [f"{n:,} steps · 2 turns" for n in range(1_001, 1_011)])
    assert seen[("QMainWindow", "LayoutRequest")] >= 10, seen
    # The text is drawn, right-aligned in the widget, on the status bar's background.
    img = label.grab().toImage()
    ref = QtGui.QImage(1, 1, img.format())  # the background as the grab's format holds it (16-bit, seen
    ref.fill(label.palette().color(label.backgroundRole()))  # after a main window's test in this process)
    bg = ref.pixelColor(0, 0)
    xs = [x for x in range(img.width()) for y in range(img.height()) if img.pixelColor(x, y) != bg]
    assert img.pixelColor(0, 0) == bg and label.text() == "1,040 steps · 2 turns"
    assert xs and img.width() - 10 < max(xs) < img.width() - 2, (min(xs), max(xs), img.width())


def test_a_wider_text_widens_it_once_and_a_narrower_one_keeps_the_width(qtbot):
    app = QtWidgets.QApplication.instance()
    label = StatusText()
    w = _window(qtbot, label)  # noqa: F841 - kept: the label is the window's
    label.setText("9 steps · 1 turn")
    app.processEvents()
    narrow = label.width()
    seen = _count(app, label, ["10,000 steps · 1 turn"])
    assert seen[("StatusText", "LayoutRequest")] + seen[("QStatusBar", "LayoutRequest")] >= 1
    wide = label.width()
    assert wide > narrow and label.sizeHint().width() >= label.fontMetrics().horizontalAdvance("10,000 steps · 1 turn")
    seen = _count(app, label, ["9 steps · 1 turn"])
    assert label.width() == wide and not [k for k in seen if k[1] == "LayoutRequest"], seen
    assert label.accessibleName() == "9 steps · 1 turn"
