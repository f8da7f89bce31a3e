"""The window's session controller: a facade over the engine child that runs the model.

The model runs in its own process (``kvinspect engine``, :mod:`kvinspect.engine`), so generation
never shares a GIL with painting and a crash of the model (out of memory, a CUDA assert, a
segfault, ``kill -9``) leaves the window up. :class:`SessionController` keeps the interface the
window always had (``load``, ``fetch``, ``send``, ``new_chat``, ``check_configs``, ``compare``,
``stop``, ``cancel``, ``drain_tokens``, ``shutdown``, ``busy``, ``info`` and the signals), and turns
each call into a protocol request (docs/engine-protocol.md). Every signal is emitted on the GUI
thread: the engine's lines arrive through :class:`~kvinspect.gui.engine_link.engine_process.EngineClient`'s QProcess.

The trace is kept on the window's side by one :class:`~kvinspect.gui.engine_link.live_trace.LiveTrace`:
each trace line the engine streams is decoded into this window's own record and appended verbatim
to the autosave file. The controller routes the other lines (tokens, progress, replies) and turns
them into signals. Nothing here imports torch.

Stop is a message the engine checks between tokens; a second Stop, or no end of the turn within
:data:`STOP_KILL_S`, kills the engine. Cancel of a load or fetch is a message checked between stages;
as ``from_pretrained`` itself cannot be interrupted, an engine that has not cancelled within
:data:`CANCEL_GRACE_S` is killed (the hard cancel) and an empty one started in its place. A dead
engine is an event (:attr:`engineDied`): finished turns stay, the running turn is closed as failed
with the exit status or signal, and :meth:`restart` reloads the model in a new engine.
"""

from __future__ import annotations

import logging
import math

from PySide6 import QtCore

from kvinspect.core.trace.messages import TRACE_KINDS
from kvinspect.engine import protocol as P
from kvinspect.engine.launch import engine_command
from kvinspect.gui.engine_link.engine_process import EngineClient, EngineExit
from kvinspect.gui.engine_link.engine_requests import CompareRequest, LoadRequest, ModelInfo, TurnRequest
from kvinspect.gui.engine_link.live_trace import LiveTrace

log = logging.getLogger(__name__)

#: After a Stop, a turn that has not ended within this long is ended by killing the engine.
STOP_KILL_S = 10.0
#: After a Cancel of a load or fetch, an engine still busy after this long is killed (the hard cancel).
CANCEL_GRACE_S = 3.0
#: The window's paint interval goes to the engine in steps this long (floored): a pace moves by a step.
PACE_STEP_S = 0.05


class SessionController(QtCore.QObject):
    """GUI-thread facade over one engine child; every signal here is emitted on the GUI thread.

    Every request ends with exactly one of modelLoaded / fetched / turnFinished / compareFinished /
    failed / cancelled, or with ``busyChanged(False)`` alone (new_chat, check_configs).
    """

    progressed = QtCore.Signal(str, str, float)  # task, stage, fraction (-1: unknown)
    modelLoaded = QtCore.Signal(object)  # ModelInfo
    fetched = QtCore.Signal(str)  # path
    turnStarted = QtCore.Signal(int)
    turnFinished = QtCore.Signal(object)  # TurnRecord (this window's)
    failed = QtCore.Signal(str, str)  # task, one-line message
    cancelled = QtCore.Signal(str)  # task
    busyChanged = QtCore.Signal(bool)
    configChecked = QtCore.Signal(str, object)  # configuration name, why it cannot run here (None: it can)
    compareProgress = QtCore.Signal(int, int, str)  # done, total (turns), message
    compareUpdated = QtCore.Signal(object)  # compare.json document so far (after every finished run)
    compareFinished = QtCore.Signal(object)  # the compare.json document
    engineDied = QtCore.Signal(str)  # one line: how the engine ended (killed by signal 9 (SIGKILL), …)
    engineState = QtCore.Signal(str)  # "starting", "ready", "unresponsive", "dead", "stopped"
    autosavePaused = QtCore.Signal(str)  # one line: why the autosave stopped (a full disk); generation goes on
    streamed = QtCore.Signal()  # a trace line or a token arrived: something new to paint (at the window's rate)
    firstOutput = QtCore.Signal()  # a turn's first step block or token: its prompt's prefill is over

    def __init__(self, session_options=None, autosave: bool = True, command=None, parent=None,
                 engine_cmd: list[str] | None = None):
        super().__init__(parent)
        self.session_options = session_options
        self.command = command  # the CLI line recorded in the trace header
        self.engine_cmd = list(engine_cmd) if engine_cmd else None  # None: engine_command() (this machine)
        self._local_cmd = self.engine_cmd  # what "this machine" means for use_engine()
        self.client: EngineClient | None = None
        self._paced: float | None = None  # the pace the engine was last told (docs/engine-protocol.md)
        self.busy = ""  # "", "load", "fetch", "turn", "new_chat", "check", "compare"
        self.info: ModelInfo | None = None
        self.dead: str | None = None  # how the engine died, until a new one has loaded a model
        self.last_load: LoadRequest | None = None  # the model to reload on restart
        self.problems: list[str] = []  # what this side could not do (a restart to cancel)
        self._closed = False
        self.restart_pending = False  # Restart engine killed a busy engine: restart once its death is handled
        self._req: tuple[int, str] | None = None  # (id, task) of the request in flight
        self._pending_load: LoadRequest | None = None
        self._pending_turn: TurnRequest | None = None
        self.live = LiveTrace(autosave, on_paused=self.autosavePaused.emit)  # record + autosave of the session
        self._tokens: list[str] = []
        self._prefilling = False  # a turn started and nothing of its output has come yet
        self._reply: list[str] = []  # the running turn's text so far (kept when the engine dies)
        self._stops = 0
        self._stop_timer = QtCore.QTimer(self, singleShot=True)
        self._stop_timer.timeout.connect(lambda: self._hard_stop("the turn did not stop within "
                                                                 f"{STOP_KILL_S:.0f} s of Stop"))
        self._cancel_timer = QtCore.QTimer(self, singleShot=True)
        self._cancel_timer.timeout.connect(self._hard_cancel)

    # -- the engine -----------------------------------------------------------------------------------
    @property
    def engine_pid(self) -> int | None:
        return self.client.pid if self.client is not None else None

    def _engine(self) -> EngineClient:
        if self.client is None or not self.client.running:
            self._start_engine()
        return self.client

    def _start_engine(self) -> None:
        c = EngineClient(self.engine_cmd, self)
        c.line.connect(self._on_line)
        c.exited.connect(lambda ex, c=c: self._on_exited(c, ex))
        c.ready.connect(lambda *_: self.engineState.emit("ready"))
        c.unresponsive.connect(lambda s: self.engineState.emit("unresponsive"))
        c.responsive.connect(lambda: self.engineState.emit("ready"))
        self.client = c
        self._paced = None  # a new engine has not been told a pace
        self.engineState.emit("starting")
        c.start()

    def _drop_engine(self) -> None:
        """Kill the current engine without reporting a death (a hard cancel or a restart)."""
        c, self.client = self.client, None
        if c is not None:
            c.kill(expected=True)
            if c.proc is not None:
                c.proc.waitForFinished(3000)
            c.deleteLater()

    def restart(self) -> bool:
        """A new engine, and the model last loaded reloaded in it (a new chat).

        While a request runs (a turn that will not stop, a hung engine) the engine is killed first and
        that is reported as its death (the running turn fails, finished ones stay); the restart follows.
        """
        if self._closed:
            return False
        if self.busy and self.client is not None and self.client.running:
            self.restart_pending = True
            self.client.kill(expected=False, reason="ended by Restart engine")
            return True
        self.restart_pending = False
        self._drop_engine()
        self.live.close()
        self.dead = None
        self._start_engine()
        if self.last_load is not None:
            return self.load(self.last_load)
        return True

    def use_engine(self, host: str | None = None, python: str | None = None) -> bool:
        """Where engines run from now on: this machine (``host`` None) or ``host`` over ssh (``python`` there).

        Returns True when that changed an engine that was running: it is ended (its session closed in
        the autosave) and the model it held is unloaded; the next request starts the new one.
        """
        cmd = engine_command(host, python) if host else self._local_cmd
        if (cmd or engine_command()) == (self.engine_cmd or engine_command()):
            return False
        self.engine_cmd = cmd
        if self.client is None:
            return False
        self._drop_engine()
        self.live.close(note=("engine_exit", {"reason": "the engine was ended to run on "
                                                          + (host or "this machine")}))
        self.info = None
        self.dead = None
        return True

    # -- requests -------------------------------------------------------------------------------------
    def _begin(self, task: str) -> bool:
        if self.busy or self._closed:
            return False
        self.busy = task
        self._stops = 0
        self.busyChanged.emit(True)
        return True

    def _request(self, task: str, kind: str, **fields) -> None:
        rid = self._engine().request(kind, **fields)
        self._req = (rid, task)

    def load(self, req: LoadRequest) -> bool:
        if self.busy or self._closed:
            return False
        self.use_engine(req.host, req.python)
        if not self._begin("load"):
            return False
        self._pending_load = req
        self._request("load", P.LOAD, spec=req.spec, device=req.device, dtype=req.dtype,
                      trust_remote_code=bool(req.trust_remote_code),
                      session=P.options_to_wire(self.session_options), command=self.command)
        return True

    def fetch(self, name: str, host: str | None = None, python: str | None = None) -> bool:
        """Fetch ``name`` where engines run (``host``: over ssh there, see :meth:`use_engine`)."""
        if self.busy or self._closed:
            return False
        self.use_engine(host, python)
        if not self._begin("fetch"):
            return False
        self._request("fetch", P.FETCH, name=name)
        return True

    def send(self, req: TurnRequest) -> bool:
        if self.info is None or self.dead is not None or not self._begin("turn"):
            return False
        self._pending_turn = req
        self._tokens.clear()
        self._reply.clear()
        self._request("turn", P.TURN, text=req.text, policy=req.policy, cache_impl=req.cache_impl,
                      settings=P.settings_to_wire(req.settings), system=req.system,
                      **({"images": list(req.images)} if req.images else {}))
        return True

    def new_chat(self) -> bool:
        if self.dead is not None or not self._begin("new_chat"):
            return False
        self._request("new_chat", P.NEW_CHAT)
        return True

    def check_configs(self, names: list[str]) -> bool:
        """Ask which of ``names`` can run with the loaded model (``configChecked`` per name)."""
        if self.info is None or self.dead is not None or not self._begin("check"):
            return False
        self._request("check", P.CHECK, names=list(names))
        return True

    def compare(self, req: CompareRequest) -> bool:
        """Run a comparison in the engine; chat and loads are refused until it ends (busy)."""
        if self.info is None or self.dead is not None or not self._begin("compare"):
            return False
        extra = {"envs": list(req.envs)} if req.envs else {}
        self._request("compare", P.COMPARE, plan=P.plan_to_wire(req.plan), out_dir=str(req.out_dir), **extra)
        return True

    def stop(self) -> None:
        """Stop the running generation after the current token; a second Stop kills the engine."""
        if self.busy != "turn" or self.client is None:
            return
        self._stops += 1
        if self._stops == 1:
            self.client.send({"type": P.STOP})
            self._stop_timer.start(int(STOP_KILL_S * 1000))
        else:
            self._hard_stop("a second Stop killed the engine")

    def pace(self, every_s: float) -> None:
        """The window paints every ``every_s`` while a turn streams: the engine's step blocks and tokens come
        at that pace, one read and one block per paint. Sent when it moves by a step, and only to an engine
        whose hello says it takes it (``paced``)."""
        c = self.client
        if c is None or not (c.hello or {}).get("paced"):
            return
        step = round(max(1, math.floor(every_s / PACE_STEP_S + 1e-9)) * PACE_STEP_S, 3)
        if step != self._paced:
            self._paced = step
            c.send({"type": P.PACE, "every_s": step})

    def _hard_stop(self, why: str) -> None:
        if self.busy == "turn" and self.client is not None:
            log.warning("hard stop: %s", why)
            self.client.kill(expected=False, reason=why)

    def cancel(self) -> None:
        """Cancel a load or fetch at its next stage (killing the engine after a grace), a comparison at its next token."""
        if self.client is None or self.busy not in ("load", "fetch", "compare"):
            return
        self.client.send({"type": P.CANCEL})
        if self.busy in ("load", "fetch") and not self._cancel_timer.isActive():
            self._cancel_timer.start(int(CANCEL_GRACE_S * 1000))

    def _hard_cancel(self) -> None:
        task = self.busy
        if task not in ("load", "fetch") or self._req is None:
            return
        log.info("hard cancel of %s: restarting the engine", task)
        had_model = self.info is not None
        self._drop_engine()
        self.live.close(note=("engine_exit", {"reason": f"the engine was restarted to cancel a {task}"}))
        self.info = None
        if had_model:
            self.problems.append(f"the engine was restarted to cancel a {task}: the model it held is unloaded")
        self._start_engine()  # an empty engine, ready for the next load
        self._finish(self.cancelled, task)

    def drain_tokens(self) -> str:
        out = "".join(self._tokens)
        self._tokens.clear()
        return out

    def shutdown(self, timeout_ms: int = 5_000) -> None:
        """Shut the engine down (it closes its session: the autosave gets its end), kill it after ``timeout_ms``."""
        if self._closed:
            return
        self._closed = True
        self._stop_timer.stop()
        self._cancel_timer.stop()
        c = self.client
        if c is not None:
            c.shutdown(timeout_ms)
        self.live.close()

    # -- replies --------------------------------------------------------------------------------------
    def _finish(self, signal, *args) -> None:
        # Not busy any more *before* listeners hear the result, so they can start the next request.
        self._req = None
        self._stop_timer.stop()
        self._cancel_timer.stop()
        self.busy = ""
        if self._closed:
            return
        self.busyChanged.emit(False)
        if signal is not None:
            signal.emit(*args)

    @QtCore.Slot(object, object)
    def _on_line(self, obj: dict, raw: bytes) -> None:
        kind = obj.get("type")
        if kind in TRACE_KINDS:
            self._trace_line(kind, obj, raw)
            if kind == "steps":
                self._output_came()
            self.streamed.emit()
            return
        if kind == P.TOKEN:
            text = obj.get("text") or ""
            self._tokens.append(text)
            self._reply.append(text)
            self._output_came()
            self.streamed.emit()
            return
        if self._closed:
            return
        if kind == P.PROGRESS:
            if self.busy in ("load", "fetch", "compare"):
                frac = obj.get("fraction")
                self.progressed.emit(obj.get("task") or self.busy, obj.get("stage") or "",
                                     -1.0 if frac is None else float(frac))
            return
        rid = obj.get("id")
        if self._req is None or rid != self._req[0]:
            if kind == P.ERROR:
                log.warning("engine: %s", obj.get("message"))
            return  # a reply to a request this window no longer waits for
        task = self._req[1]
        if kind == P.CHECKED:
            self.configChecked.emit(str(obj.get("name")), obj.get("reason"))
        elif kind == P.COMPARE_PROGRESS:
            self.compareProgress.emit(int(obj.get("done", 0)), int(obj.get("total", 0)), str(obj.get("message", "")))
        elif kind == P.COMPARE_UPDATE:
            self.compareUpdated.emit(obj.get("report") or {})
        elif kind == P.LOADED:
            self._on_loaded(obj.get("info") or {})
        elif kind == P.FETCHED:
            self._finish(self.fetched, str(obj.get("path", "")))
        elif kind == P.TURN_DONE:
            self._on_turn_done(int(obj.get("index", -1)))
        elif kind == P.COMPARED:
            self._finish(self.compareFinished, obj.get("report") or {})
        elif kind == P.DONE:
            self._finish(None)
        elif kind == P.ERROR:
            live = self.live
            if task == "load" and live.ended and self.info is not None and self.info.record is live.record:
                self.info = None  # the engine closed the old session before the new one failed to open
            self._finish(self.failed, task, str(obj.get("message") or f"{task} failed"))
        elif kind == P.CANCELLED:
            self._finish(self.cancelled, task)

    def _on_loaded(self, d: dict) -> None:
        rec = self.live.record
        info = ModelInfo(spec=d.get("spec", ""), name=d.get("name", ""), cls=d.get("cls", ""),
                         device=d.get("device", ""), dtype=d.get("dtype", ""), n_layers=int(d.get("n_layers", 0)),
                         load_seconds=float(d.get("load_seconds") or 0.0), notes=list(d.get("notes") or []),
                         trace_path=self.trace_path, record=rec, engine_pid=d.get("pid"))
        self.info = info
        self.dead = None
        self.last_load = self._pending_load
        self._finish(self.modelLoaded, info)

    def _on_turn_done(self, index: int) -> None:
        rec = self.live.record
        if rec is None or not 0 <= index < len(rec.turns):
            self._finish(self.failed, "turn", "internal error: the engine finished a turn this window never saw")
            return
        self._pending_turn = None
        self._finish(self.turnFinished, rec.turns[index])

    def _output_came(self) -> None:
        if self._prefilling:
            self._prefilling = False
            self.firstOutput.emit()

    # -- the trace: this window's record and autosave (LiveTrace) ------------------------------------------
    def _trace_line(self, kind: str, obj: dict, raw: bytes) -> None:
        msg = self.live.feed_line(kind, obj, raw)
        if msg is not None and kind == "turn_start" and not self._closed:
            self._prefilling = True
            self.turnStarted.emit(int(obj.get("index", 0)))

    @property
    def trace_path(self) -> str | None:
        """This session's autosave file (None when autosave is off or could not start)."""
        return self.live.path

    # -- death ----------------------------------------------------------------------------------------
    def _on_exited(self, client: EngineClient, ex: EngineExit) -> None:
        if client is not self.client:
            return  # an engine already replaced (a hard cancel, a restart)
        self.client = None
        client.deleteLater()
        if ex.expected or self._closed:
            self.live.close()
            return
        why = ex.message
        self.dead = why
        self.info = None
        task = self.busy
        if task == "turn":
            turn = self._fail_running_turn(why)
        self.live.close(note=("engine_exit", {"reason": why, "status": ex.code, "signal": ex.signal}))
        self.engineState.emit("dead")
        if task == "turn":
            self._finish(self.turnFinished, turn)
        elif task:
            self._finish(self.failed, task, f"the engine died: {why}" if ex.greeted else why)
        self.engineDied.emit(why)
        if self.restart_pending:
            QtCore.QTimer.singleShot(0, self.restart)

    def _fail_running_turn(self, why: str):
        """Close the turn the engine was running as failed, here and in the autosave; return it."""
        from kvinspect.core.detect.events import TURN_FAILED, Event
        from kvinspect.core.trace.messages import EventMsg, Turn
        from kvinspect.core.trace.record import TraceRecord, TurnRecord

        live_rec = self.live.record
        rec = live_rec if live_rec is not None else TraceRecord(0, {})
        req = self._pending_turn
        with rec.lock:
            turn = rec.turns[-1] if rec.turns and rec.turns[-1].status == "running" else None
            if turn is None:  # died before the turn started: it never reached the record
                turn = TurnRecord(index=len(rec.turns), user=req.text if req else "", first_step=rec.n_steps,
                                  policy=req.policy if req else "", cache_impl=req.cache_impl if req else "")
            end = rec.n_steps
            forwards = max(end - turn.first_step, 0)
        turn.status = "failed"
        turn.error = f"the engine died: {why}"
        turn.end_step = end
        turn.reply = "".join(self._reply)
        if forwards:
            turn.prefill_tokens = int(rec.q_len[turn.first_step])
            turn.new_tokens = forwards  # one token per forward pass
            if 0 < turn.prefill_tokens <= turn.prompt_tokens:
                turn.reused_tokens = turn.prompt_tokens - turn.prefill_tokens
        ev = Event(TURN_FAILED, "error", turn.index, turn.first_step, turn.error,
                   "Chat → Restart engine reloads the model in a new engine and continues with a new chat; "
                   "every finished turn is kept, here and in the autosave.",
                   data={"engine_exit": why})
        if live_rec is None:  # no session to keep it in: the turn is only shown
            rec.add_event(ev)
            rec.add_turn(turn)
        else:
            self.live.append(EventMsg(ev))
            self.live.append(Turn(turn))
        self._pending_turn = None
        return turn
