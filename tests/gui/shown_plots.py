"""A shown plots widget that has drawn a record: the setup most plot tests share."""

from __future__ import annotations


def plots_showing(qtbot, rec, size: tuple[int, int] = (1000, 600), theme=None):
    """A new plots widget of ``size`` (the redraw benchmark's by default), in ``theme`` if given,
    shown and exposed, that has drawn ``rec``."""
    from kvinspect.gui.lanes.lanes_widget import PlotsWidget

    w = PlotsWidget()
    qtbot.addWidget(w)
    w.resize(*size)
    if theme is not None:
        w.apply_theme(theme)
    w.show()
    qtbot.waitExposed(w)
    w.render(rec, force=True)
    return w
