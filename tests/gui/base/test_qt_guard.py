"""Guards for the PySide6 pin (< 6.11): the 6.12.0 refcount bug aborts Python 3.11 (exit 134).

Both tests do what crashed on 6.12.0 within seconds: many void-returning calls on a live
plot, and hundreds of queued cross-thread signals, in a subprocess so an abort at exit is
seen as a non-zero exit status rather than hidden behind "N passed".
"""

import subprocess
import sys
import textwrap

PLOT_LOOP = textwrap.dedent("""
    import os, sys
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    from PySide6 import QtCore, QtWidgets
    import numpy as np, pyqtgraph as pg
    app = QtWidgets.QApplication([])
    w = pg.PlotWidget(); w.resize(600, 400); w.show(); app.processEvents()
    curve = w.plot()
    x = np.arange(200.0)
    for i in range(400):
        curve.setData(x, np.sin(x / 10 + i))
        w.viewport().repaint()
        app.processEvents()
    sys.exit(0)
""")

SIGNALS = textwrap.dedent("""
    import os, sys, threading
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    from PySide6 import QtCore
    app = QtCore.QCoreApplication([])
    class Emitter(QtCore.QObject):
        number = QtCore.Signal(int)
        thing = QtCore.Signal(object)
    class Sink(QtCore.QObject):
        got = 0
        @QtCore.Slot(int)
        def on_number(self, n): Sink.got += 1
        @QtCore.Slot(object)
        def on_thing(self, o):
            Sink.got += 1
            if Sink.got >= 600: app.quit()
    e, s = Emitter(), Sink()
    e.number.connect(s.on_number, QtCore.Qt.ConnectionType.QueuedConnection)
    e.thing.connect(s.on_thing, QtCore.Qt.ConnectionType.QueuedConnection)
    def work():
        for i in range(300):
            e.number.emit(i); e.thing.emit({"i": i})
    t = threading.Thread(target=work); t.start()
    QtCore.QTimer.singleShot(20000, app.quit)
    app.exec(); t.join()
    assert Sink.got == 600, Sink.got
""")


def _run(code):
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


def test_plot_refresh_loop_survives():
    r = _run(PLOT_LOOP)
    assert r.returncode == 0, f"exit {r.returncode}: {r.stderr[-800:]}"


def test_queued_cross_thread_signals_survive_exit():
    r = _run(SIGNALS)
    assert r.returncode == 0, f"exit {r.returncode}: {r.stderr[-800:]}"


def test_pyside6_pin():
    import PySide6

    major, minor = (int(x) for x in PySide6.__version__.split(".")[:2])
    assert (major, minor) < (6, 11), f"PySide6 {PySide6.__version__}: see docs/dependencies.md before lifting the pin"
