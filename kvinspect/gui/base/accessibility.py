"""Accessible names and descriptions: what a screen reader says for each control and plot.

Qt gives a button its text as a name, but a text area, a table, a spin box or a plot has
none until one is set. The main window's controls are named here, in one table (attribute
path → name, description); :func:`fill_missing` then names anything left from what a sighted
user reads next to it (the button's text, its tooltip, its placeholder), so a control added
later is never silent. tests/gui/windows/test_desktop_conventions.py checks every control has both.
"""

from __future__ import annotations

from PySide6 import QtWidgets

#: The widget classes a user operates or reads values from (pyqtgraph plots are QGraphicsViews).
CONTROLS = (QtWidgets.QAbstractButton, QtWidgets.QComboBox, QtWidgets.QLineEdit, QtWidgets.QAbstractSpinBox,
            QtWidgets.QTextEdit, QtWidgets.QPlainTextEdit, QtWidgets.QAbstractItemView, QtWidgets.QAbstractSlider,
            QtWidgets.QProgressBar, QtWidgets.QGraphicsView)

#: The main window's controls: attribute path from the window → (name, description).
WINDOW = {
    "plots.view": ("Cache plots", "Per step, left to right: event markers; a layers × steps heatmap of the tokens "
                   "each layer's cache stores; seen and stored tokens; memory per device. Hover for values, "
                   "click a marker for its event"),
    "plots.pick_button": ("Layers to plot", "Pick layers to draw as curves in the tokens lane"),
    "plots.follow_box": ("Follow the run", "Keep every step in view as the run grows"),
    "chat.system": ("System prompt", "Optional system prompt; applies from the next turn"),
    "chat.transcript": ("Conversation", "The live conversation, streamed as it is generated; click a turn to "
                        "show it in the plots"),
    "chat.replay": ("Recorded conversation", "The conversation of the trace being viewed"),
    "chat.policy": ("Reuse policy", "How the next turn handles the cache: the correct reuse or a classic mistake"),
    "chat.cache_impl": ("Cache implementation", "The cache class for caches created from the next turn on"),
    "chat.max_new": ("Max new tokens", "The most tokens the next reply may have"),
    "chat.mode": ("Decoding", "Greedy (deterministic) or sampling"),
    "chat.temperature": ("Temperature", "Sampling temperature (sampling only)"),
    "chat.top_p": ("Top-p", "Nucleus sampling threshold (sampling only)"),
    "chat.seed": ("Seed", "Random seed for sampling"),
    "chat.input": ("Message", "The next user message: Enter sends, Shift+Enter adds a line"),
    "chat.send_button": ("Send", "Send the message and generate a reply"),
    "chat.stop_button": ("Stop", "Stop after the current token; the turn is kept and marked stopped"),
    "chat.new_button": ("New chat", "Forget the conversation and the cache; the record keeps every turn"),
    "events.tree": ("Events", "What the detectors found, one row per event: severity, turn, step, kind, layers"),
    "events.detail": ("Event detail", "What happened, the numbers behind it, and what to do"),
    "events.copy_button": ("Copy event as Markdown", "Copy the selected event for pasting into an issue"),
    "checklist.turn_box": ("Checklist turn", "Which turn's checklist to show"),
    "checklist.view": ("Checklist", "Per turn: cache reused, length vs conversation, window applied, device; "
                       "pass, warn or fail with the evidence"),
    "layers.view": ("Layer table", "Per layer at the step shown: kind, tokens seen and stored, capacity, device, "
                    "memory"),
    "find_box": ("Find in the conversation", "Text to find in the conversation: Enter finds the next match, "
                 "Esc closes"),
    "progress": ("Progress", "Progress of the model load or fetch"),
    "cancel_button": ("Cancel", "Cancel the load or fetch at its next stage"),
    "restart_button": ("Restart engine", "Start a new model process and reload the model"),
    "viewer.bar.slider": ("Replay step", "The step of the trace shown: drag to replay"),
    "viewer.bar.spin": ("Replay step number", "The step of the trace shown"),
    "viewer.bar.turn_box": ("Replay turn", "Jump to a turn of the trace"),
    "viewer.bar.latest": ("Latest step", "Show the latest step as the followed trace grows"),
    "viewer.bar.stop_button": ("Stop following", "Stop reading the followed trace; keep what was read"),
    "viewer.bar.back_button": ("Back to live session", "Leave the trace and show the live session"),
}


#: The model picker's controls (:class:`~kvinspect.gui.dialogs.model_picker.ModelPicker`).
PICKER = {
    "list": ("Models", "The built-in models (layer kinds and windows), SmolLM2, or Other"),
    "spec": ("Model spec", "A built-in name, a hub id, a model folder or a .gguf file"),
    "fetch_button": ("Fetch SmolLM2", "Download the real SmolLM2 model once (93 MB, verified)"),
    "fetch_progress": ("Fetch progress", "Progress of the SmolLM2 download"),
    "file_button": ("Choose a file", "Pick a .gguf file"),
    "dir_button": ("Choose a folder", "Pick a model folder"),
    "device": ("Device", "Where the model runs: auto, CPU, a GPU"),
    "dtype": ("Data type", "The weights' dtype: auto, float32, bfloat16, float16"),
    "trust": ("Trust remote code", "Run the model repository's own Python code (only for sources you trust)"),
    "run_local": ("Run on this machine", "Start the engine here"),
    "run_ssh": ("Run on an ssh host", "Start the engine on another machine over ssh"),
    "host": ("ssh host", "An ssh destination: user@host or an ssh config alias"),
    "python": ("Remote python", "The host's python that has kvinspect installed (default python3)"),
}


def _at(root, path: str):
    obj = root
    for part in path.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj


def name(widget: QtWidgets.QWidget, text: str, description: str) -> None:
    widget.setAccessibleName(text)
    widget.setAccessibleDescription(description)


def describe(root: QtWidgets.QWidget, table: dict) -> None:
    """Name ``root``'s controls from ``table`` (attribute path → (name, description)), then the rest."""
    for path, (text, description) in table.items():
        w = _at(root, path)
        if isinstance(w, QtWidgets.QWidget):
            name(w, text, description)
    fill_missing(root)


def describe_window(win) -> None:
    """Name the main window's controls (:data:`WINDOW`), then everything else in it (:func:`fill_missing`)."""
    for path, (text, description) in WINDOW.items():
        w = _at(win, path)
        if isinstance(w, QtWidgets.QWidget):
            name(w, text, description)
    win.setAccessibleName("kvinspect")
    win.setAccessibleDescription("KV cache inspector: chat with a model and watch its cache, layer by layer")
    fill_missing(win)


def _first_sentence(text: str) -> str:
    text = " ".join(text.split())
    for stop in (". ", "; ", " ("):
        if stop in text:
            text = text.split(stop, 1)[0]
    return text.rstrip(".")


#: Qt-internal widgets that hold the user's own (a scroll area's page, a tab widget's pages): not parts.
HOLDERS = {"qt_scrollarea_viewport", "qt_tabwidget_stackedwidget"}


def is_control(w: QtWidgets.QWidget) -> bool:
    """A control of ours: not a Qt-internal part (a spin box's line edit, a combo's popup, a table's header,
    a line edit's clear button)."""
    if not isinstance(w, CONTROLS) or isinstance(w, QtWidgets.QScrollBar) or w.objectName().startswith("qt_"):
        return False
    p = w.parentWidget()
    while p is not None:
        if isinstance(p, (QtWidgets.QComboBox, QtWidgets.QAbstractSpinBox, QtWidgets.QAbstractItemView,
                          QtWidgets.QLineEdit)) \
                or (p.objectName().startswith("qt_") and p.objectName() not in HOLDERS):
            return False
        p = p.parentWidget()
    return True


def fill_missing(root: QtWidgets.QWidget) -> int:
    """Name and describe every control under ``root`` that has no name (or description) yet; returns how many."""
    done = 0
    for w in root.findChildren(QtWidgets.QWidget):
        if not is_control(w):
            continue
        text = w.text() if isinstance(w, QtWidgets.QAbstractButton) else ""
        text = text.replace("&&", "\0").replace("&", "").replace("\0", "&")
        tip = w.toolTip()
        placeholder = w.placeholderText() if hasattr(w, "placeholderText") else ""
        if not w.accessibleName():
            label = text or _first_sentence(tip) or placeholder or w.objectName().replace("-", " ").replace("_", " ")
            if label:
                w.setAccessibleName(label)
                done += 1
        if not w.accessibleDescription():
            w.setAccessibleDescription(tip or placeholder or w.accessibleName())
    return done
