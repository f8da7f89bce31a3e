"""The window stays alive while the model generates: its heartbeat keeps beating and its plots repaint.

A functional check, not a timing one (no bound on any gap or duration: a busy machine cannot fail it).
A 10 ms timer on the GUI thread counts its beats, an event filter counts the plot view's paint
events, and each paint of the window's paint clock records how far the record had grown. A turn with no
practical end is started; once the heartbeat has beaten ``BEATS`` times, the plot has been
painted ``PAINTS`` times and the paint tick has seen the record at ``GROWTH`` different lengths,
all while that turn was generating, Stop ends it. However slow the machine, that only takes
longer. How *well* the UI keeps up (max gap, p99) is measured by ``benchmarks/heartbeat.py``.
"""

from __future__ import annotations

from PySide6 import QtCore

from tests.gui.helpers import TURN_TIMEOUT_MS, load

BEATS, PAINTS, GROWTH = 10, 5, 5


class _PaintCounter(QtCore.QObject):
    def __init__(self, while_=lambda: True):
        super().__init__()
        self.n = 0
        self.while_ = while_

    def eventFilter(self, obj, event):  # noqa: N802 - Qt's name
        if event.type() == QtCore.QEvent.Type.Paint and self.while_():
            self.n += 1
        return False


def test_heartbeat_beats_and_window_repaints_during_generation(qtbot, window):
    load(qtbot, window, "tiny-gemma3")
    c = window.controller
    generating = lambda: c.busy == "turn" and window.record is not None and window.record.n_steps > 0  # noqa: E731
    beats = [0]

    def beat():
        if generating():
            beats[0] += 1

    hb = QtCore.QTimer()
    hb.setTimerType(QtCore.Qt.TimerType.PreciseTimer)
    hb.setInterval(10)
    hb.timeout.connect(beat)
    paints = _PaintCounter(generating)
    viewport = window.plots.view.viewport()
    viewport.installEventFilter(paints)
    seen: set[int] = set()

    def on_tick():
        if generating():
            seen.add(window.record.n_steps)

    window.renderedTick.connect(on_tick)
    chat = window.chat
    chat.max_new.setValue(100_000)  # no practical end: Stop ends it once everything was seen
    chat.input.setPlainText("Tell me everything about sliding windows and caches, at length.")
    try:
        with qtbot.waitSignal(c.turnFinished, timeout=TURN_TIMEOUT_MS * 3) as finished:
            hb.start()
            chat.send()
            qtbot.waitUntil(lambda: beats[0] >= BEATS and paints.n >= PAINTS and len(seen) >= GROWTH,
                            timeout=TURN_TIMEOUT_MS * 2)
            assert c.busy == "turn"  # all of it happened while the turn was still generating
            window.stop()
    finally:
        hb.stop()
        viewport.removeEventFilter(paints)
        window.renderedTick.disconnect(on_tick)
    turn = finished.args[0]
    assert turn.status == "stopped" and 0 < turn.new_tokens < 100_000
    assert beats[0] >= BEATS and paints.n >= PAINTS and len(seen) >= GROWTH
    # The transcript streamed too: the reply so far is on screen.
    assert turn.reply and turn.reply[:20] in chat.plain_text()
