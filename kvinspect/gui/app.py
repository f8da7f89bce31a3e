"""Bootstrap: make the QApplication, build the main window, run it.

Only Qt, pyqtgraph and the light parts of the core are imported here. torch and transformers
are never imported by the window's process: the model runs in an engine child
(:mod:`kvinspect.engine`), so the window is on screen in well under two seconds
(``benchmarks/startup.py``) and a crash of the model leaves it up.

``KVINSPECT_QUIT_AFTER=MS`` prints ``kvinspect: window shown`` once the window is on screen
and quits MS milliseconds later (startup benchmark, bundle smoke tests).
``KVINSPECT_MODULES_REPORT=FILE`` makes ``kvinspect gui`` write, as it exits, which modules its own
process had imported (JSON: ``torch``, ``transformers``, ``modules``); the test that the window stays
torch-free while it chats reads it.
"""

from __future__ import annotations

import os
import sys

# PySide6 before pyqtgraph, so pyqtgraph binds to it rather than to a PyQt that may be installed.
from PySide6 import QtCore, QtWidgets  # noqa: I001

from kvinspect import __version__
from kvinspect.core.paths import ephemeral
from kvinspect.gui.base import gui_thread_gc
from kvinspect.gui.base.resources import app_icon


def create(exec_app: bool = False, settings=None, session_options=None, persist: bool | None = None,
           autosave: bool = True, **window_kwargs):
    """Make (or reuse) the QApplication and a shown :class:`MainWindow`. Returns ``(app, window)``.

    Tests call this with ``exec_app=False``; settings are written only when ``persist`` (by
    default: unless ``KVINSPECT_EPHEMERAL`` is set, see :func:`kvinspect.core.paths.ephemeral`).
    """
    app = QtWidgets.QApplication.instance() or QtWidgets.QApplication(sys.argv[:1])
    app.setApplicationName("kvinspect")
    app.setOrganizationName("kvinspect")
    app.setApplicationVersion(__version__)
    app.setDesktopFileName("kvinspect")
    app.setWindowIcon(app_icon())
    from kvinspect.gui.windows.main_window import MainWindow

    if persist is None:
        persist = not ephemeral()
    win = MainWindow(settings=settings, session_options=session_options, persist=persist, autosave=autosave,
                     **window_kwargs)
    win.show()
    gui_thread_gc.settle()  # Qt, pyqtgraph and the window are long-lived: keep them out of every later pass
    # app.exit()/quit() skip closeEvent: stop the engine and save settings on the way out too.
    app.aboutToQuit.connect(win.shutdown)
    _maybe_quit_after(app, win)
    if exec_app:
        app.exec()
    return app, win


def _maybe_quit_after(app, win) -> None:
    ms = os.environ.get("KVINSPECT_QUIT_AFTER")
    if not ms:
        return

    def shown():
        print("kvinspect: window shown", flush=True)
        QtCore.QTimer.singleShot(int(ms), app.quit)

    QtCore.QTimer.singleShot(0, shown)  # runs once the event loop has shown and painted the window


def run_from_args(args, argv: list[str] | None = None) -> int:
    """``kvinspect gui`` / bare ``kvinspect``. User mistakes in flags or files raise KvInspectError first."""
    from kvinspect.core.session.options import apply_script_overrides, session_options
    from kvinspect.core.session.policies import check_cache_impl, check_policy
    from kvinspect.core.session.script import GenerationSettings, load_script

    argv = list(argv or [])
    options = session_options(args)  # bad template path, bad --generation-config: one line, exit 2
    script = apply_script_overrides(load_script(args.script), args) if args.script else None
    if (args.screenshot or args.exit_when_done) and not args.model:
        from kvinspect.core.errors import ScriptError

        raise ScriptError("--screenshot and --exit-when-done need --model (and usually --script)")
    if args.screenshot is not None:
        check_screenshot_path(args.screenshot)

    from kvinspect.core.settings import load_settings
    from kvinspect.gui.base.errors_and_logs import configure_logging, install_excepthook

    settings = load_settings()
    explicit = {a.split("=", 1)[0] for a in argv if a.startswith("--")}
    if "--policy" in explicit:
        settings.policy = check_policy(args.policy)
    if "--cache" in explicit:
        settings.cache_impl = check_cache_impl(args.cache)
    scripted = bool(args.script or args.screenshot or args.exit_when_done)
    app, win = create(exec_app=False, settings=settings, session_options=options,
                      persist=not scripted and not ephemeral())
    configure_logging()
    install_excepthook(win.errors)
    gen: GenerationSettings | None = script.settings if script else None
    if gen is None and (args.max_new_tokens is not None or args.seed is not None):
        gen = win.chat.settings()
        if args.max_new_tokens is not None:
            gen.max_new_tokens = args.max_new_tokens
        if args.seed is not None:
            gen.seed = args.seed
    if gen is not None:
        win.chat.apply_settings(gen)
    system = script.system if script and script.system is not None else args.system
    if system is not None:
        win.chat.system.setPlainText(system)
    if scripted:
        from kvinspect.gui.windows.script_driver import ScriptDriver

        win.driver = ScriptDriver(win, script.turns if script else [], args.screenshot, args.exit_when_done,
                                  images=script.images if script else [])
    if args.model:
        win.load(args.model, args.device, args.dtype, args.trust_remote_code,
                 host=getattr(args, "ssh", None), python=getattr(args, "ssh_python", None))
    else:
        QtCore.QTimer.singleShot(0, win.open_picker)  # no model given: start in the picker
    code = app.exec()
    _report_modules()
    return code


def check_screenshot_path(value: str) -> None:
    """Refuse a ``--screenshot`` path that cannot be written before the window opens (one line, exit 2)."""
    from pathlib import Path

    from kvinspect.core.errors import ScriptError

    if not value.strip():
        raise ScriptError("--screenshot is empty; give a .png path")
    p = Path(value).expanduser()
    if p.is_dir():
        raise ScriptError(f"--screenshot {value} is a folder; give a .png path")
    for parent in p.parents:
        if parent.exists():
            if not parent.is_dir():
                raise ScriptError(f"--screenshot {value}: {parent} is a file, not a folder")
            if not os.access(parent, os.W_OK):
                raise ScriptError(f"--screenshot {value}: cannot write in {parent}")
            break


def _report_modules() -> None:
    path = os.environ.get("KVINSPECT_MODULES_REPORT")
    if not path:
        return
    import json

    top = sorted({name.split(".")[0] for name in list(sys.modules)})
    try:
        with open(path, "w", encoding="utf-8") as f:
            json.dump({"pid": os.getpid(), "torch": "torch" in sys.modules,
                       "transformers": "transformers" in sys.modules, "modules": top}, f)
    except OSError as exc:
        print(f"kvinspect: cannot write {path}: {exc.strerror or exc}", file=sys.stderr)


def open_viewer(record=None, path: str | None = None, follow: str | None = None, source=None,
                theme: str | None = None, settings=None, persist: bool | None = None):
    """A window showing a trace: ``record`` read from ``path`` (view mode) or ``follow`` (a file or folder).

    Returns ``(app, window)`` without running the event loop (``kvinspect view`` runs it; tests don't).
    The window's own session is empty until a model is loaded from it ("Back to live session").
    """
    from kvinspect.core.settings import load_settings
    from kvinspect.gui.base.errors_and_logs import configure_logging, install_excepthook

    settings = settings or load_settings()
    if theme:
        settings.theme = theme
    app, win = create(exec_app=False, settings=settings,
                      persist=not ephemeral() if persist is None else persist)
    if not ephemeral():
        configure_logging()
        install_excepthook(win.errors)
    if follow is not None:
        win.follow_trace(follow, source)
    elif record is not None:
        win.viewer.show(record, path or "trace.jsonl")
    return app, win


def run_viewer(**kwargs) -> int:
    """``kvinspect view``: the window on a trace, until it is closed."""
    app, _win = open_viewer(**kwargs)
    return app.exec()
