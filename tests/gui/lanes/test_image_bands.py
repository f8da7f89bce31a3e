"""Image spans in the window: the tokens lane shades each image's positions per layer kind while it is held,
and the chat pane attaches pictures to the next message."""

from __future__ import annotations

import pytest

from kvinspect.core.media.bands import image_bands
from tests.gui.helpers import plots_showing
from tests.helpers import RESOURCES


@pytest.fixture(scope="module")
def vl_record():
    from kvinspect.core.session.chat import ChatSession
    from kvinspect.core.session.options import SessionOptions
    from kvinspect.core.session.script import GenerationSettings
    from tests.conftest import load_vl

    o = SessionOptions()
    o.settings = GenerationSettings(max_new_tokens=12)
    s = ChatSession(load_vl(), o)
    s.run_turn("what is in this picture?", images=[RESOURCES / "images" / "gradient.png"])
    s.run_turn("and this one?", images=[RESOURCES / "images" / "checker.png"])
    s.close()
    return s.record


def test_tokens_lane_shades_each_image_per_kind_until_it_is_let_go(qtbot, vl_record):
    w = plots_showing(qtbot, vl_record)
    lane = w.tokens
    assert set(lane.image_items) == {"full", "sliding"}
    bands = image_bands(vl_record)
    for kind, item in lane.image_items.items():
        mine = sorted((b.x0, b.x1) for b in bands if b.kind == kind)
        assert sorted((r.left(), r.right()) for r in item.rects) == [(float(a), float(b)) for a, b in mine]
    # The sliding strip of image 1 ends at turn 2's prefill; the full strip runs to the last step.
    sliding = sorted(item.left() for item in lane.image_items["sliding"].rects)
    assert sliding == [0.0, float(vl_record.turns[1].first_step)]
    assert sorted(lab.toPlainText().split(" #")[0] for lab in lane.image_labels.values()) == ["image 1", "image 2"]
    # Replay at a step of turn 1: only the first image, its bands cut at that step.
    w.render(vl_record, step=3, force=True)
    assert [lab.toPlainText().split(" #")[0] for lab in lane.image_labels.values()] == ["image 1"]
    assert max(r.right() for r in lane.image_items["full"].rects) == 4.0


def test_chat_pane_attaches_images_to_the_next_message(qtbot):
    from kvinspect.gui.panels.chat_panel import ChatPanel

    p = ChatPanel()
    qtbot.addWidget(p)
    img = str(RESOURCES / "images" / "gradient.png")
    p.attach_images([img])
    assert p.request("look").images == [img] and "gradient.png" in p.attached.text() and not p.attached.isHidden()
    p.begin_turn(0, "look", "reuse", "dynamic", images=[img])
    assert "<img" in p.transcript.toHtml() and "gradient.png" in p.transcript.toHtml()
    p.clear_images()
    assert p.request("next").images == [] and p.attached.isHidden()


def test_dropped_image_files_and_a_pasted_picture_attach_to_the_next_message(qtbot):
    from PySide6 import QtCore, QtGui

    from kvinspect.gui.panels.chat_panel import ChatPanel

    p = ChatPanel()
    qtbot.addWidget(p)
    img = str(RESOURCES / "images" / "checker.png")
    drop = QtCore.QMimeData()
    drop.setUrls([QtCore.QUrl.fromLocalFile(img), QtCore.QUrl.fromLocalFile(str(RESOURCES / "scripts" / "demo.json"))])
    assert p.input.canInsertFromMimeData(drop)
    p.input.insertFromMimeData(drop)
    assert p.images == [img] and p.input.toPlainText() == ""
    paste = QtCore.QMimeData()
    picture = QtGui.QImage(8, 6, QtGui.QImage.Format.Format_RGB32)
    picture.fill(QtGui.QColor("#3D7EFF"))
    paste.setImageData(picture)
    p.input.insertFromMimeData(paste)
    assert len(p.images) == 2 and p.images[1].endswith(".png") and not QtGui.QImage(p.images[1]).isNull()
    text = QtCore.QMimeData()
    text.setText("just words")
    p.input.insertFromMimeData(text)
    assert p.input.toPlainText() == "just words" and len(p.images) == 2


def test_tokens_panel_draws_each_image_as_one_block(qtbot, vl_record):
    from kvinspect.gui.panels.tokens_panel import TokensPanel, tooltip

    p = TokensPanel()
    qtbot.addWidget(p)
    p.resize(900, 400)
    p.show()
    qtbot.waitExposed(p)
    p.render(vl_record)
    c = p.canvas
    c._relayout()
    view = c.view
    assert sorted(view.media) == sorted(c._image_label) and len(c._image_label) == 2
    for cell, (n, label) in view.media.items():
        assert c._w[cell] > 0 and (c._w[cell + 1:cell + n] == 0).all() and label.startswith("image 16 tok #")
        assert "image 16 tok" in tooltip(view, cell)
    c.repaint()  # paints without error, the hidden cells skipped
