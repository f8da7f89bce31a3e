"""One long-lived worker on a QThread runs everything slow: fetch, load, turns.

The worker only calls the core (``fetch``, ``load_model``, ``ChatSession``) and appends to
the session's record; it never touches a widget. :class:`SessionController` lives on the
GUI thread, owns the thread and the worker, and relays the worker's signals as its own
main-thread signals (tests and widgets connect to those; waiting on a signal emitted from
another thread makes Qt warn about timers). Tokens are not signalled one by one: the worker
appends them to a locked buffer that the paint timer drains, so the token rate can never
flood the event loop.

Stop and Cancel are ``threading.Event`` flags the worker polls (generation checks its flag
at every token; loading between stages). Shutting down asks the worker to close its
session and quit its own thread, so the GUI thread can ``wait()`` without a deadlock.
"""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass, field

from PySide6 import QtCore

from ..core.errors import Cancelled, KvInspectError

log = logging.getLogger(__name__)


@dataclass
class LoadRequest:
    spec: str
    device: str = "auto"
    dtype: str = "auto"
    trust_remote_code: bool = False


@dataclass
class TurnRequest:
    text: str
    policy: str = "reuse"
    cache_impl: str = "dynamic"
    settings: object = None  # GenerationSettings
    system: str | None = None


@dataclass
class CompareRequest:
    """A comparison for the loaded model (Tools → Compare configurations…)."""

    plan: object  # core.compare.ComparePlan
    out_dir: str


@dataclass
class ModelInfo:
    """What the window shows about a loaded model; plain data, safe to pass across threads."""

    spec: str
    name: str
    cls: str
    device: str
    dtype: str
    n_layers: int
    load_seconds: float
    notes: list[str] = field(default_factory=list)
    trace_path: str | None = None
    record: object = None  # the session's TraceRecord


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _settle_for_generation() -> None:
    """Leave one core to the window while this thread generates.

    torch's intra-op threads spin on every core otherwise (on a 2-core laptop the UI then
    stalls for 100+ ms). Not when the user chose a thread count (``OMP_NUM_THREADS`` /
    ``KVINSPECT_TORCH_THREADS``). Garbage collection is the GUI thread's job (gc_policy).
    """
    want = os.environ.get("KVINSPECT_TORCH_THREADS")
    try:
        import torch

        if want:
            torch.set_num_threads(max(1, int(want)))
        elif not os.environ.get("OMP_NUM_THREADS"):
            cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
            torch.set_num_threads(max(1, min(torch.get_num_threads(), cores - 1)))
    except (ImportError, ValueError, RuntimeError) as exc:
        log.info("torch threads left as they are: %s", exc)


class SessionWorker(QtCore.QObject):
    """Lives on the worker thread. Slots run there; signals are relayed by the controller."""

    progressed = QtCore.Signal(str, str, float)  # task, stage, fraction (-1: unknown)
    loaded = QtCore.Signal(object)  # ModelInfo
    fetched = QtCore.Signal(str)  # path
    turnStarted = QtCore.Signal(int)
    turnFinished = QtCore.Signal(object)  # TurnRecord
    failed = QtCore.Signal(str, str)  # task, one-line message
    cancelled = QtCore.Signal(str)  # task
    idle = QtCore.Signal()  # a request that has no result of its own is done
    configChecked = QtCore.Signal(str, object)  # configuration name, why it cannot run here (None: it can)
    compareProgress = QtCore.Signal(int, int, str)  # done, total (turns), message
    compareUpdated = QtCore.Signal(object)  # compare.json document so far (after every finished run)
    compared = QtCore.Signal(object, object)  # CompareResult, compare.json document

    # Every request ends with exactly one of loaded/fetched/turnFinished/compared/failed/cancelled/idle.

    def __init__(self, session_options=None, autosave: bool = True, command: list[str] | None = None):
        super().__init__()
        self.cancel_flag = threading.Event()
        self.stop_flag = threading.Event()
        # Open (set) except while the window paints; see SessionController.painting().
        self.ui_gate = threading.Event()
        self.ui_gate.set()
        self.base_options = session_options
        self.autosave = autosave
        self.command = command
        self.session = None
        self.loaded_model = None
        self._tokens: list[str] = []
        self._tokens_lock = threading.Lock()

    # -- tokens: written here, drained by the GUI's paint timer -----------------------------
    def _on_token(self, text: str) -> None:
        with self._tokens_lock:
            self._tokens.append(text)

    def drain_tokens(self) -> str:
        with self._tokens_lock:
            out = "".join(self._tokens)
            self._tokens.clear()
        return out

    def _should_stop(self) -> bool:
        """Called by generate() once per token: Stop, and a short wait while the window paints."""
        self.ui_gate.wait(0.05)
        return self.stop_flag.is_set()

    # -- slots ------------------------------------------------------------------------------
    @QtCore.Slot(object)
    def load(self, req: LoadRequest) -> None:
        try:
            from ..core.loading import load_model

            def progress(stage: str, frac) -> None:
                self.progressed.emit("load", stage, -1.0 if frac is None else float(frac))

            loaded = load_model(req.spec, device=req.device, dtype=req.dtype,
                                trust_remote_code=req.trust_remote_code, progress=progress,
                                cancel=self.cancel_flag.is_set)
            # Swap only once the new model is ready: a failed or cancelled load keeps the old one usable.
            self._close_session()
            info = self._open_session(loaded)
            _settle_for_generation()
        except Cancelled:
            self.cancelled.emit("load")
        except KvInspectError as exc:
            self.failed.emit("load", str(exc))
        except Exception as exc:  # noqa: BLE001 - a bug: logged with traceback, shown as one line
            log.exception("loading %s failed", req.spec)
            self.failed.emit("load", f"could not load {req.spec}: {type(exc).__name__}: {_one_line(exc)}")
        else:
            self.loaded.emit(info)

    def _open_session(self, loaded) -> ModelInfo:
        import copy

        from ..core.session import ChatSession, SessionOptions

        from ..core.autosave import autosave_path

        # Every session is written as it runs (a crash keeps every finished turn); old ones are pruned.
        trace = autosave_path(loaded.name) if self.autosave else None
        opts = copy.deepcopy(self.base_options) if self.base_options is not None else SessionOptions()
        self.session = ChatSession(loaded, opts, trace_path=trace, command=self.command)
        self.loaded_model = loaded
        return ModelInfo(
            spec=loaded.spec, name=loaded.name, cls=type(loaded.model).__name__, device=loaded.device,
            dtype=loaded.dtype, n_layers=self.session.record.n_layers, load_seconds=loaded.load_seconds,
            notes=list(loaded.notes), trace_path=str(trace) if trace else None, record=self.session.record,
        )

    @QtCore.Slot(str)
    def fetch(self, name: str) -> None:
        try:
            from ..core.fetch import fetch

            def progress(stage: str, frac) -> None:
                self.progressed.emit("fetch", stage, -1.0 if frac is None else float(frac))

            path = fetch(name, progress=progress, cancel=self.cancel_flag.is_set)
        except Cancelled:
            self.cancelled.emit("fetch")
        except KvInspectError as exc:
            self.failed.emit("fetch", str(exc))
        except Exception as exc:  # noqa: BLE001
            log.exception("fetching %s failed", name)
            self.failed.emit("fetch", f"could not fetch {name}: {type(exc).__name__}: {_one_line(exc)}")
        else:
            self.fetched.emit(str(path))

    @QtCore.Slot(object)
    def run_turn(self, req: TurnRequest) -> None:
        s = self.session
        try:
            if s is None:
                raise KvInspectError("load a model first")
            from ..core.session import check_cache_available, check_cache_impl, check_policy

            policy, impl = check_policy(req.policy), check_cache_impl(req.cache_impl)
            check_cache_available(s.loaded, impl)
            if req.settings is not None:
                req.settings.validate()
                s.options.settings = req.settings
            s.options.policy, s.options.cache_impl = policy, impl
            if req.system is not None:
                s.options.system = req.system or None
            self.turnStarted.emit(len(s.record.turns))
            turn = s.run_turn(req.text, on_token=self._on_token, should_stop=self._should_stop)
        except KvInspectError as exc:
            self.failed.emit("turn", str(exc))
        except Exception as exc:  # noqa: BLE001 - run_turn records model errors itself; this is a bug
            log.exception("turn failed")
            self.failed.emit("turn", f"internal error: {type(exc).__name__}: {_one_line(exc)} (details in the log)")
        else:
            self.turnFinished.emit(turn)

    @QtCore.Slot(object)
    def check_configs(self, names: list[str]) -> None:
        """Which configurations can run with the loaded model here (static+compile compiles a probe: seconds)."""
        try:
            from ..core.compare_configs import parse_config, unavailable_reason

            for name in names:
                try:
                    reason = unavailable_reason(self.loaded_model, parse_config(name))
                except KvInspectError as exc:
                    reason = str(exc)
                except Exception as exc:  # noqa: BLE001 - a failed probe means "not here", with why
                    log.exception("checking %s failed", name)
                    reason = f"could not check: {type(exc).__name__}: {_one_line(exc)}"
                self.configChecked.emit(name, reason)
        finally:
            self.idle.emit()

    def _compare_stop(self) -> bool:
        self.ui_gate.wait(0.05)
        return self.cancel_flag.is_set()

    @QtCore.Slot(object)
    def compare(self, req: CompareRequest) -> None:
        """run_compare on this thread: the chat session's observer is idle between turns, so nothing mixes."""
        try:
            if self.loaded_model is None:
                raise KvInspectError("load a model first")
            from ..core.compare import run_compare
            from ..core.compare_report import build_report

            def on_run(result) -> None:
                self.compareUpdated.emit(build_report(result))

            result = run_compare(self.loaded_model, req.plan, req.out_dir,
                                 progress=lambda done, total, msg: self.compareProgress.emit(done, total, msg),
                                 cancel=self._compare_stop, on_run=on_run)
            data = build_report(result)
        except KvInspectError as exc:
            self.failed.emit("compare", str(exc))
        except Exception as exc:  # noqa: BLE001
            log.exception("comparison failed")
            self.failed.emit("compare",
                             f"comparison failed: {type(exc).__name__}: {_one_line(exc)} (details in the log)")
        else:
            self.compared.emit(result, data)

    @QtCore.Slot()
    def new_chat(self) -> None:
        if self.session is not None:
            self.session.reset()
        self.idle.emit()

    @QtCore.Slot()
    def shutdown(self) -> None:
        """Close the session (flushes the trace) and end this thread's event loop."""
        try:
            self._close_session()
        except Exception:  # noqa: BLE001 - never keep the thread alive over a failed close
            log.exception("closing the session failed")
        QtCore.QThread.currentThread().quit()

    def _close_session(self) -> None:
        if self.session is not None:
            self.session.close()
        self.session = None
        self.loaded_model = None


class SessionController(QtCore.QObject):
    """GUI-thread owner of the worker thread; every signal here is emitted on the GUI thread."""

    progressed = QtCore.Signal(str, str, float)
    modelLoaded = QtCore.Signal(object)
    fetched = QtCore.Signal(str)
    turnStarted = QtCore.Signal(int)
    turnFinished = QtCore.Signal(object)
    failed = QtCore.Signal(str, str)
    cancelled = QtCore.Signal(str)
    busyChanged = QtCore.Signal(bool)
    configChecked = QtCore.Signal(str, object)
    compareProgress = QtCore.Signal(int, int, str)
    compareUpdated = QtCore.Signal(object)
    compareFinished = QtCore.Signal(object, object)  # CompareResult, compare.json document

    _load = QtCore.Signal(object)
    _check = QtCore.Signal(object)
    _compare = QtCore.Signal(object)
    _fetch = QtCore.Signal(str)
    _turn = QtCore.Signal(object)
    _new_chat = QtCore.Signal()
    _shutdown = QtCore.Signal()

    def __init__(self, session_options=None, autosave: bool = True, command=None, parent=None):
        super().__init__(parent)
        self.thread = QtCore.QThread()
        self.thread.setObjectName("kvinspect-worker")
        self.worker = SessionWorker(session_options, autosave, command)
        self.worker.moveToThread(self.thread)
        self.thread.finished.connect(self.worker.deleteLater)
        w = self.worker
        self._load.connect(w.load)
        self._fetch.connect(w.fetch)
        self._turn.connect(w.run_turn)
        self._new_chat.connect(w.new_chat)
        self._check.connect(w.check_configs)
        self._compare.connect(w.compare)
        self._shutdown.connect(w.shutdown)
        w.progressed.connect(self.progressed)
        w.turnStarted.connect(self.turnStarted)
        w.loaded.connect(self._on_loaded)
        # Bound slots of this GUI-thread object (not lambdas): Qt then queues them onto this thread.
        w.fetched.connect(self._on_fetched)
        w.turnFinished.connect(self._on_turn_finished)
        w.failed.connect(self._on_failed)
        w.cancelled.connect(self._on_cancelled)
        w.idle.connect(self._on_idle)
        w.configChecked.connect(self._on_config_checked)
        w.compareProgress.connect(self._on_compare_progress)
        w.compareUpdated.connect(self._on_compare_updated)
        w.compared.connect(self._on_compared)
        self.busy = ""  # "", "load", "fetch", "turn", "new_chat", "check", "compare"
        self.info: ModelInfo | None = None
        self._closed = False
        self.thread.start()

    # -- requests ---------------------------------------------------------------------------
    def _begin(self, task: str) -> bool:
        if self.busy or self._closed:
            return False
        self.busy = task
        self.busyChanged.emit(True)
        return True

    def load(self, req: LoadRequest) -> bool:
        if not self._begin("load"):
            return False
        self.worker.cancel_flag.clear()  # here, not on the worker: a Cancel right after must not be lost
        self._load.emit(req)
        return True

    def fetch(self, name: str) -> bool:
        if not self._begin("fetch"):
            return False
        self.worker.cancel_flag.clear()
        self._fetch.emit(name)
        return True

    def send(self, req: TurnRequest) -> bool:
        if self.info is None or not self._begin("turn"):
            return False
        self.worker.stop_flag.clear()
        self._turn.emit(req)
        return True

    def new_chat(self) -> bool:
        if not self._begin("new_chat"):
            return False
        self._new_chat.emit()
        return True

    def check_configs(self, names: list[str]) -> bool:
        """Ask which of ``names`` can run with the loaded model (``configChecked`` per name)."""
        if self.info is None or not self._begin("check"):
            return False
        self._check.emit(list(names))
        return True

    def compare(self, req: CompareRequest) -> bool:
        """Run a comparison on the worker; chat and loads are refused until it ends (busy)."""
        if self.info is None or not self._begin("compare"):
            return False
        self.worker.cancel_flag.clear()
        self._compare.emit(req)
        return True

    def stop(self) -> None:
        """Stop the running generation after the current token (the turn is kept, marked stopped)."""
        self.worker.stop_flag.set()

    def cancel(self) -> None:
        """Cancel a load or fetch at its next stage boundary, a comparison at its next token."""
        self.worker.cancel_flag.set()

    def drain_tokens(self) -> str:
        return self.worker.drain_tokens()

    def hold_for_paint(self) -> None:
        """Hold generation at its next token until :meth:`release_paint` (or 50 ms at most).

        PySide releases the GIL around every C++ call, and a paint makes hundreds of them; with
        a Python-heavy generate() loop on the worker, each one waits up to a switch interval to
        get the GIL back, so a 5 ms paint took 30-50 ms of wall time. Holding the worker at a
        token boundary instead lets the paint run at CPU speed.
        """
        self.worker.ui_gate.clear()

    def release_paint(self) -> None:
        self.worker.ui_gate.set()

    def shutdown(self, timeout_ms: int = 120_000) -> None:
        """Stop everything and join the thread (the worker quits its own loop: no deadlock)."""
        if self._closed:
            return
        self._closed = True
        self.worker.stop_flag.set()
        self.worker.cancel_flag.set()
        self.worker.ui_gate.set()
        self._shutdown.emit()
        if not self.thread.wait(timeout_ms):
            log.error("the worker did not stop within %d s", timeout_ms // 1000)

    # -- relays -----------------------------------------------------------------------------
    def _finish(self, signal, *args) -> None:
        # Not busy any more *before* listeners hear the result, so they can start the next request.
        self.busy = ""
        self.busyChanged.emit(False)
        if signal is not None:
            signal.emit(*args)

    @QtCore.Slot(object)
    def _on_loaded(self, info: ModelInfo) -> None:
        self.info = info
        self._finish(self.modelLoaded, info)

    @QtCore.Slot(str)
    def _on_fetched(self, path: str) -> None:
        self._finish(self.fetched, path)

    @QtCore.Slot(object)
    def _on_turn_finished(self, turn) -> None:
        self._finish(self.turnFinished, turn)

    @QtCore.Slot(str, str)
    def _on_failed(self, task: str, message: str) -> None:
        self._finish(self.failed, task, message)

    @QtCore.Slot(str)
    def _on_cancelled(self, task: str) -> None:
        self._finish(self.cancelled, task)

    @QtCore.Slot()
    def _on_idle(self) -> None:
        self._finish(None)

    @QtCore.Slot(str, object)
    def _on_config_checked(self, name: str, reason) -> None:
        self.configChecked.emit(name, reason)

    @QtCore.Slot(int, int, str)
    def _on_compare_progress(self, done: int, total: int, message: str) -> None:
        self.compareProgress.emit(done, total, message)

    @QtCore.Slot(object)
    def _on_compare_updated(self, data) -> None:
        self.compareUpdated.emit(data)

    @QtCore.Slot(object, object)
    def _on_compared(self, result, data) -> None:
        self._finish(self.compareFinished, result, data)
