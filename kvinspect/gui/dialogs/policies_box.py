"""Help → Reuse policies: what each policy does to the cache across turns."""

from __future__ import annotations

import html

from PySide6 import QtCore, QtWidgets

from kvinspect.gui.base.accessibility import fill_missing, name


def show_policies(parent) -> QtWidgets.QMessageBox:
    """Non-modal: it can stay open next to the chat while trying the policies."""
    from kvinspect.core.session.policies import POLICY_HELP

    rows = "".join(f"<tr><td valign='top'><b>{k}</b></td><td>{html.escape(v)}</td></tr>" for k, v in POLICY_HELP.items())
    box = QtWidgets.QMessageBox(QtWidgets.QMessageBox.Icon.Information, "Reuse policies", "",
                                QtWidgets.QMessageBox.StandardButton.Ok, parent)
    box.setText("<p>Change the policy between turns to show the right way and each mistake side by side.</p>"
                f"<table cellpadding='3'>{rows}</table>")
    name(box, "Reuse policies", "What each reuse policy of the chat does with the cache")
    name(box.button(QtWidgets.QMessageBox.StandardButton.Ok), "OK", "Close the list of policies")
    fill_missing(box)
    box.setWindowModality(QtCore.Qt.WindowModality.NonModal)
    box.setAttribute(QtCore.Qt.WidgetAttribute.WA_DeleteOnClose)
    box.show()
    return box
