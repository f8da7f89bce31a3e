"""While the engine prefills a prompt the window paints nothing (the prefill wants every core, and
its length is the turn's time to first token): the turn's start is painted with its first output."""

from __future__ import annotations


def test_no_paint_while_a_prompt_is_prefilled_and_the_first_output_releases_the_clock(qtbot, window):
    from tests.gui.helpers import load, send

    load(qtbot, window, "tiny-llama")
    # (as a person would, the first message is sent once the loaded model is drawn: a resize of the
    # new view still on its way is an interaction, and is never held)
    qtbot.waitUntil(lambda: not window.clock.running, timeout=5000)
    c = window.controller
    log: list[str] = []
    c.turnStarted.connect(lambda i: log.append("start"))
    c.firstOutput.connect(lambda: log.append("output"))
    window.renderedTick.connect(lambda: log.append("paint"))
    for text in ("Tell me a story.", "And another one."):
        turn = send(qtbot, window, text, max_new_tokens=60)
        assert turn.status == "ok"
    starts = [i for i, x in enumerate(log) if x == "start"]
    assert len(starts) == 2 and log.count("output") == 2  # one first output a turn
    for i in starts:
        # (the first output comes a tiny prompt's prefill later: far sooner than the hold's end)
        assert log[i + 1] == "output", log[i: i + 4]
    assert "paint" in log[starts[0]:]  # painted as it streamed
    qtbot.waitUntil(lambda: not window.clock.running, timeout=5000)  # and nothing is held once the turns ended
