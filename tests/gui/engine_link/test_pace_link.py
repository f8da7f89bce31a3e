"""The window tells its engine the pace it paints at: on a change of a step, and only to an engine that
takes it (an engine's hello says ``paced``)."""

from __future__ import annotations

from types import SimpleNamespace

from kvinspect.engine import protocol as P
from kvinspect.gui.engine_link.session_controller import PACE_STEP_S, SessionController


def _controller(hello):
    c = SessionController(autosave=False)
    sent: list[dict] = []
    c.client = SimpleNamespace(hello=hello, send=sent.append)
    return c, sent


def test_the_pace_goes_out_in_steps_and_only_when_it_moves(qapp):
    c, sent = _controller({"type": "hello", "paced": True})
    for every_s in (0.1, 0.1, 0.12, 0.149, 0.333, 0.34, 0.2, 0.01):
        c.pace(every_s)
    assert [x["type"] for x in sent] == [P.PACE] * 4
    assert [x["every_s"] for x in sent] == [0.1, 0.3, 0.2, PACE_STEP_S]  # floored to a step, never zero
    c.client = None
    c.pace(0.5)  # no engine: nothing to tell
    assert len(sent) == 4


def test_an_engine_that_does_not_say_it_takes_a_pace_is_not_sent_one(qapp):
    for hello in ({"type": "hello"}, None):  # an older engine; one that has not said hello yet
        c, sent = _controller(hello)
        c.pace(0.3)
        assert sent == []


def test_a_window_whose_frames_are_dear_paces_its_real_engine(qtbot, window, monkeypatch, caplog):
    import kvinspect.gui.base.paint_clock as paint_clock
    from tests.gui.helpers import load, send

    monkeypatch.setattr(paint_clock, "CPU_BUDGET", 1e-9)  # every frame over budget: the slowest live rate
    load(qtbot, window, "tiny-llama")
    # A tiny model's turn can end within the interactive half second that its first frames start (the
    # plots' first fit): turns until one had a live frame.
    for _ in range(6):
        turn = send(qtbot, window, "Tell me a long story.", max_new_tokens=400)
        assert turn.status == "ok"
        if window.clock.frame_cpu is not None:
            break
    assert window.clock.live_interval() == paint_clock.SLOWEST_LIVE_MS / 1000
    assert window.controller._paced == round(paint_clock.SLOWEST_LIVE_MS / 1000, 3)  # told while the turn streamed
    assert not [r for r in caplog.records if "pace" in r.getMessage()]  # the engine took it, no error came back
    again = send(qtbot, window, "And another.", max_new_tokens=40)  # a paced engine still ends its turns whole
    assert again.status == "ok" and again.index == len(window.record.turns) - 1
    assert window.record.n_steps == again.end_step  # every step of the paced turn reached the record
