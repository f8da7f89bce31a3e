"""The window paints what changed, at the rate a person sees, and ends every turn as a full repaint would.

A real engine and a real tiny model stream into the window, which paints through its paint clock
(about ten times a second, the panels only when their content moves). At a turn's end and on Stop its
plots, token view, layer table and status bar are compared with a second window that was given the
same record once and painted it at once.
"""

from __future__ import annotations

import pytest
from PySide6 import QtCore, QtGui

from kvinspect.gui.base.paint_clock import on_screen
from kvinspect.gui.panels.layer_table import layer_rows
from tests.gui.helpers import TURN_TIMEOUT_MS, load, send


def _counting(panel, calls: list) -> None:
    original = panel.render

    def render(record, step=None):
        calls.append(step)
        original(record, step)

    panel.render = render


def test_hidden_panels_cost_nothing_and_an_idle_window_runs_no_timer(qtbot, window):
    load(qtbot, window, "tiny-gemma3")
    calls: list = []
    _counting(window.layers, calls)
    window.check_dock.raise_()
    qtbot.waitUntil(lambda: not on_screen(window.layers))  # tabbed behind the checklist
    turn = send(qtbot, window, "Hello! What does a KV cache store?", max_new_tokens=60)
    assert turn.status == "ok"
    qtbot.waitUntil(lambda: not window.clock.running, timeout=5000)
    assert calls == [], "the hidden layer table was rendered"

    # Idle: the finished chat is shown, nothing is dirty, no paint timer runs or paints.
    paints = window.clock.paints
    qtbot.wait(600)
    assert window.clock.paints == paints and not window.clock.running

    # Shown: rendered once, with the record's final state.
    window.layers_dock.raise_()
    qtbot.waitUntil(lambda: len(calls) == 1, timeout=5000)
    assert window.layers.model.rows == layer_rows(window.record, None)


def _still(qtbot, win) -> None:
    win.refresh(force=True)
    qtbot.wait(50)
    win.refresh(force=True)


def _images(qtbot, win) -> dict[str, QtGui.QImage]:
    out = {"plots": win.plots.grab().toImage()}
    for name, panel, dock in (("tokens", win.tokens, win.tokens_dock), ("layers", win.layers, win.layers_dock)):
        dock.raise_()
        qtbot.waitUntil(lambda panel=panel: on_screen(panel) and panel not in win._stale, timeout=5000)
        qtbot.wait(100)  # the layout settles: a summary that grew a line moves the canvas below it
        if panel is win.tokens and win.tokens.view is not None:
            # Where the token view is scrolled is not the record's: it depends on the canvas' height when it
            # was rendered (a panel rendered as its tab is raised, before its layout settled). Both windows
            # take the same scroll rule from the top, in their settled layouts; every cell is the record's.
            win.tokens.canvas.verticalScrollBar().setValue(0)
            win.tokens.canvas.scroll_to_cell(len(win.tokens.view) - 1)
        out[name] = panel.grab().toImage()
    win.check_dock.raise_()
    return out


def _compare_with_painted_at_once(qtbot, win, tmp_path, name: str) -> None:
    from kvinspect.core.settings import Settings
    from kvinspect.gui.app import create

    settings = Settings()
    settings.window.width, settings.window.height = win.width(), win.height()
    _, fresh = create(settings=settings, persist=False, autosave=False)
    qtbot.addWidget(fresh)
    qtbot.waitExposed(fresh)
    fresh.resize(win.size())
    fresh.resizeDocks([fresh.chat_dock], [win.chat_dock.width()], QtCore.Qt.Orientation.Horizontal)
    fresh.set_record(win.record)
    _still(qtbot, fresh)
    _still(qtbot, win)
    assert fresh.plots.size() == win.plots.size()
    live, at_once = _images(qtbot, win), _images(qtbot, fresh)
    for key, img in live.items():
        if img != at_once[key]:
            img.save(str(tmp_path / f"{name}-{key}-live.png"))
            at_once[key].save(str(tmp_path / f"{name}-{key}-at-once.png"))
        assert img == at_once[key], f"{name}: the live {key} differ from the same record painted at once ({tmp_path})"
    assert win.steps_label.text() == fresh.steps_label.text()
    assert win.layers.model.rows == fresh.layers.model.rows == layer_rows(win.record, None)
    assert win.events.count() == fresh.events.count() == len(win.record.events)
    fresh.close()


def test_a_turn_painted_live_ends_as_the_same_record_painted_at_once(qtbot, window, tmp_path):
    load(qtbot, window, "tiny-gemma3")
    window.tokens_dock.raise_()  # the token view shown while it streams
    turn = send(qtbot, window, "Hello! What does a KV cache store?", max_new_tokens=150)
    assert turn.status == "ok"
    _compare_with_painted_at_once(qtbot, window, tmp_path, "turn-end")

    # Stop mid-turn: the view is the stopped turn's, as a full repaint of it.
    c = window.controller
    window.chat.max_new.setValue(100_000)
    window.chat.input.setPlainText("Tell me everything about sliding windows, at length.")
    first = window.record.n_steps
    with qtbot.waitSignal(c.turnFinished, timeout=TURN_TIMEOUT_MS) as finished:
        window.chat.send()
        qtbot.waitUntil(lambda: window.record.n_steps > first + 120, timeout=TURN_TIMEOUT_MS)
        window.stop()
    assert finished.args[0].status == "stopped"
    _compare_with_painted_at_once(qtbot, window, tmp_path, "stop")


def test_where_frames_are_dear_the_text_moves_each_frame_the_plots_on_a_share_and_a_stop_ends_whole(
        qtbot, window, tmp_path):
    """On a machine where a frame a second costs more than the window's CPU budget (made so here: each
    render of the plots counts 60 ms more on the clock's CPU clock), the transcript still takes its
    tokens every live frame and the plots are painted on a share of them; Stop then shows the record
    as a full repaint of it would."""
    load(qtbot, window, "tiny-gemma3")
    window.tokens_dock.raise_()
    dear, appended, rendered = [0.0], [0], [0]
    render, append, cpu = window.plots.render, window.chat.append_tokens, window.clock.cpu

    def dear_render(*a, **kw):
        if window.clock.streaming:
            rendered[0] += 1
        dear[0] += 0.06
        return render(*a, **kw)

    def counted_append(text):
        appended[0] += window.clock.streaming
        return append(text)

    window.plots.render = dear_render
    window.chat.append_tokens = counted_append
    window.clock.cpu = lambda: cpu() + dear[0]
    c = window.controller
    window.chat.max_new.setValue(100_000)
    window.chat.input.setPlainText("Tell me everything about sliding windows, at length.")
    with qtbot.waitSignal(c.turnFinished, timeout=TURN_TIMEOUT_MS) as finished:
        window.chat.send()
        qtbot.waitUntil(lambda: window.clock.short_frames >= 1, timeout=TURN_TIMEOUT_MS)  # the estimates settled
        before = appended[0], rendered[0]
        qtbot.waitUntil(lambda: window.clock.short_frames >= 4 and rendered[0] > before[1], timeout=TURN_TIMEOUT_MS)
        texts, plots = appended[0] - before[0], rendered[0] - before[1]
        window.stop()
    assert finished.args[0].status == "stopped"
    assert window.clock.whole_share() < 1 and texts >= plots + 2, (texts, plots)
    _compare_with_painted_at_once(qtbot, window, tmp_path, "dear-stop")


def test_each_stream_line_is_decoded_once_and_never_by_a_paint(qtbot, window):
    load(qtbot, window, "tiny-gemma3")
    live = window.controller.live
    decoded, lines, in_paint = [0], [0], []
    decode, feed, paint = live._decoder.decode, live.feed_line, window._paint

    def counting_decode(*a, **kw):
        decoded[0] += 1
        return decode(*a, **kw)

    def counting_feed(*a, **kw):
        lines[0] += 1
        return feed(*a, **kw)

    def watched_paint():
        parts = paint()  # (in parts: lines read between them are the stream's, not the paint's)
        while True:
            before = decoded[0]
            try:
                next(parts)
            except StopIteration:
                return
            finally:
                in_paint.append(decoded[0] - before)
            yield

    live._decoder.decode = counting_decode
    live.feed_line = counting_feed
    window.clock._paint = watched_paint
    window.tokens_dock.raise_()
    turn = send(qtbot, window, "Hello! What does a KV cache store?", max_new_tokens=80)
    assert turn.status == "ok" and lines[0] > 2
    assert decoded[0] == lines[0], "a stream line was decoded more (or less) than once"
    assert in_paint and set(in_paint) == {0}, "a paint decoded a stream line"


def test_a_sent_turn_lays_out_and_paints_before_its_request_reaches_the_engine(qtbot, window):
    """What a send changes (the message, the buttons, the toolbar's relayout of the whole window) is laid
    out and painted inside ``send``: the request reaches the engine after it, from the event loop, so
    the prompt's prefill doesn't share the cores with that work."""
    from PySide6 import QtWidgets

    load(qtbot, window, "tiny-llama")
    send(qtbot, window, "A first turn, so the second sends into a warm window.", max_new_tokens=4)
    proc = window.controller.client.proc
    phase, inside = ["before"], []
    kinds = {QtCore.QEvent.Type.LayoutRequest: "layout", QtCore.QEvent.Type.UpdateRequest: "paint"}

    class Spy(QtCore.QObject):
        def eventFilter(self, obj, ev):
            kind = kinds.get(ev.type())
            if kind == "paint" and phase[0] == "sending" and obj is window:
                inside.append(kind)
            elif kind == "layout" and phase[0] == "sending" and isinstance(obj, QtWidgets.QWidget):
                inside.append(kind)
            return False

    def written(_n):
        phase.append("written")

    spy = Spy()
    proc.bytesWritten.connect(written)
    app = QtWidgets.QApplication.instance()
    app.installEventFilter(spy)
    try:
        chat = window.chat
        with qtbot.waitSignal(window.controller.turnFinished, timeout=TURN_TIMEOUT_MS):
            phase[0] = "sending"
            assert window.send(chat.request("The second question?"))
            phase[0] = "sent"
            assert "written" not in phase, "the request was written inside send()"
    finally:
        app.removeEventFilter(spy)
        proc.bytesWritten.disconnect(written)
    assert "written" in phase
    assert "layout" in inside and inside[-1] == "paint", f"send() left its layout or paint to the event loop: {inside}"


@pytest.mark.smollm2
def test_mid_turn_the_plots_show_what_a_full_repaint_of_them_shows(qtbot, window, smollm2_fetched):
    """Live frames repaint strips; at any moment of a streaming SmolLM2 turn, what the plots' pixmap
    caches hold is what the same items paint from scratch (a strip drawn alone differs in no pixel:
    with its columns wider than a pixel and drawn scaled, it did at some column edges)."""
    from PySide6 import QtWidgets

    load(qtbot, window, "smollm2")
    window.resize(1400, 860)
    window.chat.max_new.setValue(250)
    window.chat.input.setPlainText("Write a long story about a lighthouse keeper who finds a message in a bottle.")
    c = window.controller
    first = window.record.n_steps if window.record is not None else 0
    with qtbot.waitSignal(c.turnFinished, timeout=TURN_TIMEOUT_MS):
        window.chat.send()
        for extra in (60, 130, 200):
            qtbot.waitUntil(lambda extra=extra: window.record is not None and window.record.n_steps > first + extra,
                            timeout=TURN_TIMEOUT_MS)
            qtbot.wait(120)  # a paint or two at the live rate
            live = window.plots.grab().toImage()
            for item in window.plots.view.scene().items():
                mode = item.cacheMode()
                item.setCacheMode(QtWidgets.QGraphicsItem.CacheMode.NoCache)
                item.setCacheMode(mode)
            assert live == window.plots.grab().toImage(), f"step {window.record.n_steps}: a strip left stale pixels"
