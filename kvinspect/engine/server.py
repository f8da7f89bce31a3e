"""``kvinspect engine``: the session behind a JSON-lines protocol on stdin/stdout (docs/engine-protocol.md).

Three threads. The **request loop** (the main thread) runs one request at a time: load, fetch, a
turn, a comparison, a check; it owns the model and the :class:`~kvinspect.core.session.chat.ChatSession`.
The **reader** reads the window's lines: Stop and Cancel set flags the moment they arrive (generation
checks Stop between tokens, loading checks Cancel between stages, a comparison at every token);
everything else is queued for the request loop. The **writer** (:class:`~.stdio.LineWriter`) owns
the protocol stdout. A heartbeat thread says every second that the engine is alive and what it is busy
with, so the window can tell a busy engine from a hung one; while it waits for a request it is silent.

The engine writes no trace file: the session's stream (header, steps, turn_start, turn, event, devices,
note, end) goes out on stdout as trace lines, tokens as ``token`` lines; the window appends the trace
lines to its own autosave and decodes them with the trace reader's decoder. Every step of a turn is
sent before its ``turn`` line, and the ``turn_done`` reply comes after it.

When stdin closes (the window is gone, or the ssh channel dropped) the engine stops what it is doing
and exits; if the request loop is stuck in a call that cannot be interrupted, it exits anyway after a
few seconds.
"""

from __future__ import annotations

import faulthandler
import logging
import os
import platform
import queue
import socket
import sys
import threading
import time

from kvinspect import __version__
from kvinspect.core.errors import Cancelled, KvInspectError, exc_line
from kvinspect.engine import protocol as P
from kvinspect.engine.stdio import LineWriter, read_lines, take_stdio

log = logging.getLogger(__name__)

#: Steps are sent this often while a turn runs, until the window says its pace: the window paints at
#: most 10 times a second while a model streams (2 where its frames are dear), and one block per paint
#: is decoded once, not two half blocks.
FLUSH_EVERY_S = 0.1
#: After stdin closes, a request loop that does not come back within this long is not waited for.
EOF_GRACE_S = 5.0


def serve(*, heartbeat_s: float = P.HEARTBEAT_S) -> int:
    """Take stdin/stdout, greet, and serve requests until shutdown or end of input. Returns the exit status."""
    inp, out = take_stdio()
    # A fatal signal (an abort in a native library, a crash at exit) leaves every thread's Python stack on
    # stderr, which the window keeps in its log: the one trace of an engine that died without a word.
    faulthandler.enable()

    def broken() -> None:
        # Nobody can read us any more: nothing left to do. Said on stderr (the window's log and its exit
        # message) with its own status, so a broken stdout never reads as a clean exit.
        log.error("the engine's protocol stdout is closed or broken; the engine exits (status %d)", P.EXIT_PIPE)
        try:
            sys.stderr.flush()
        except (OSError, ValueError):
            pass
        os._exit(P.EXIT_PIPE)

    writer = LineWriter(out, on_broken=broken)
    return Engine(inp, writer, heartbeat_s=heartbeat_s).serve()


class Engine:
    """The request loop and its helpers; ``serve`` returns the process's exit status."""

    def __init__(self, inp, writer: LineWriter, *, heartbeat_s: float = P.HEARTBEAT_S):
        self.inp = inp
        self.out = writer
        self.heartbeat_s = heartbeat_s
        self.stop = threading.Event()
        self.cancel = threading.Event()
        self.requests: queue.SimpleQueue = queue.SimpleQueue()
        self.session = None
        self.loaded = None
        self._working = threading.Event()  # set when a request starts: the heartbeat wakes
        self._busy = ""
        self.local = True
        self.pace_s = FLUSH_EVERY_S  # step blocks (and the writer's batches) this often; the window's `pace`
        self._t0 = time.monotonic()
        self._done = threading.Event()

    # -- lifetime -------------------------------------------------------------------------------------
    def serve(self) -> int:
        self.out.send(P.engine_hello(__version__, pid=os.getpid(), host=socket.gethostname(),
                                     python=platform.python_version(), executable=sys.executable, paced=True))
        threading.Thread(target=self._read_loop, name="kvinspect-engine-reader", daemon=True).start()
        threading.Thread(target=self._heartbeat_loop, name="kvinspect-engine-heartbeat", daemon=True).start()
        try:
            first = self.requests.get()
            if first is None:
                return 0
            try:
                P.check_hello(first, __version__, peer_role="window")
            except P.ProtocolError as exc:
                log.error("%s", exc)
                self.out.send({"type": P.ERROR, "id": P.request_id(first), "task": P.HELLO, "message": str(exc)})
                return P.EXIT_HANDSHAKE
            self.local = bool(first.get("local", True))
            self._preload()
            while True:
                req = self.requests.get()
                if req is None:
                    break
                if req.get("type") == P.SHUTDOWN:
                    self._close_session()
                    self.out.send({"type": P.BYE, "id": req.get("id")})
                    break
                self._dispatch(req)
        finally:
            self._done.set()
            self._working.set()  # (an idle heartbeat thread waits on this: it ends too)
            try:
                self._close_session()
            except Exception:  # noqa: BLE001 - exiting anyway
                log.exception("closing the session failed")
            # The model is freed here, on this thread. The reader and heartbeat threads hold this engine
            # through their targets until they end, and the last one to drop it would free the model's
            # tensors while the interpreter finalizes: torch's dealloc waits for the GIL there, Python ends
            # the thread, and the unwind through torch's frames aborts the process (exit status -6).
            self.loaded = None
            self.out.close()
        return 0

    def _preload(self) -> None:
        """Import what a load needs before the window asks for one (docs/engine-protocol.md).

        About 2.5 s of a warm load is importing torch and transformers. A window's user is still
        picking a model then, so the imports happen while they pick and the load is the reading of
        weights. In the request loop, not a thread: two threads importing one package can meet a
        module the other has half initialised. Requests that arrive meanwhile wait in the queue;
        Stop and Cancel still act on arrival.
        """
        self.busy = "starting"
        t = time.perf_counter()
        try:
            import torch  # noqa: F401
            import transformers
            from transformers import GenerationMixin, PreTrainedModel  # noqa: F401  (modeling and generation)

            from kvinspect.core.model import loading  # noqa: F401
            from kvinspect.core.session import chat  # noqa: F401
        except Exception as exc:  # noqa: BLE001 - the load request will say what is missing, in its own words
            log.info("preloading torch and transformers failed: %s", exc_line(exc))
        else:
            log.debug("torch %s and transformers %s imported in %.2f s", torch.__version__,
                      transformers.__version__, time.perf_counter() - t)
        finally:
            self.busy = ""

    def _read_loop(self) -> None:
        """Read the window's lines until end of input. Every line gets an answer or an effect; nothing ends
        this thread but end of input (a fault reading the pipe counts as one), so the engine never goes on
        beating its heart while it can no longer hear the window."""
        try:
            for raw in read_lines(self.inp, P.MAX_LINE_BYTES):
                try:
                    self._take(raw)
                except Exception:  # noqa: BLE001 - a bug here must not leave a deaf engine behind
                    log.exception("could not handle a request line")
                    self._refuse(None, "?", "internal error while reading a request (details in the log)")
        except Exception:  # noqa: BLE001 - the pipe itself failed: as good as closed
            log.exception("reading the window's requests failed; treating it as the end of input")
        # End of input: the window is gone. Stop what runs; do not wait for an uninterruptible load.
        self.stop.set()
        self.cancel.set()
        self.requests.put(None)
        if self.busy == "starting":  # still importing torch: nothing to finish or save, and no import can be cut short
            self.out.close(timeout=1.0)
            os._exit(0)
        if not self._done.wait(EOF_GRACE_S):
            log.warning("stdin closed and the engine is still busy (%s): exiting now", self.busy)
            os._exit(0)

    def _take(self, raw: bytes | None) -> None:
        """One line from the window: parsed (depth-limited), checked against its request's schema, then
        acted on (Stop, Cancel) or queued. A line that fails is answered with one error line and dropped."""
        if raw is None:
            self._refuse(None, "?", f"a request line over {P.MAX_LINE_BYTES:,} bytes was dropped")
            return
        if not raw.strip():
            return
        try:
            obj = P.parse_line(raw)
        except P.ProtocolError as exc:
            log.warning("refused a request line: %s", exc)
            self._refuse(None, "?", str(exc))
            return
        kind = obj.get("type")
        try:
            P.check_request(obj)
        except P.ProtocolError as exc:
            log.warning("refused a request: %s", exc)
            known = isinstance(kind, str) and kind in P.REQUESTS | P.SIGNALS | {P.HELLO}
            self._refuse(P.request_id(obj), kind if known else "?", str(exc))
            return
        if kind == P.STOP:
            self.stop.set()
        elif kind == P.PACE:
            self._pace(float(obj["every_s"]))
        elif kind == P.CANCEL:
            self.cancel.set()
        elif kind == P.SHUTDOWN:
            self.stop.set()
            self.cancel.set()
            self.requests.put(obj)
        else:  # a request or the hello (check_request knows no other type)
            # Flags are cleared as a request arrives, in order: a Stop or Cancel sent after it is never lost.
            self.stop.clear()
            self.cancel.clear()
            self.requests.put(obj)

    def _pace(self, every_s: float) -> None:
        """The window paints every ``every_s`` while a turn streams: step blocks and lazy lines (tokens) go
        out at that pace, so each of its paints reads and decodes one batch (docs/engine-protocol.md)."""
        lo, hi = P.PACE_RANGE_S
        self.pace_s = min(hi, max(lo, every_s))
        self.out.batch_s = self.pace_s
        session = self.session
        if session is not None:
            session.pipeline.flush_every_s = self.pace_s

    def _refuse(self, rid, task: str, message: str) -> None:
        self.out.send({"type": P.ERROR, "id": rid, "task": task, "message": message})

    @property
    def busy(self) -> str:
        """The request running ("starting" while torch is imported), or "" while the engine waits for one."""
        return self._busy

    @busy.setter
    def busy(self, kind: str) -> None:
        self._busy = kind
        if kind:
            self._working.set()

    def _heartbeat_loop(self) -> None:
        # An idle engine says nothing: each line would wake an idle window (whose watchdog listens only while
        # it waits for a reply). Work wakes this loop; its first beat comes one heartbeat_s in.
        while not self._done.is_set():
            if not self.busy:
                self._working.wait()
                self._working.clear()
            if self._done.wait(self.heartbeat_s):
                return
            if self.busy:
                self.out.send({"type": P.HEARTBEAT, "busy": self.busy, "t": round(time.monotonic() - self._t0, 3)})

    # -- requests -------------------------------------------------------------------------------------
    def _dispatch(self, req: dict) -> None:
        kind = req["type"]
        rid = req.get("id")
        handler = getattr(self, f"_do_{kind}", None)
        if handler is None:
            self.out.send({"type": P.ERROR, "id": rid, "task": kind, "message": f"unexpected {kind!r} request"})
            return
        self.busy = kind
        try:
            handler(req)
        except Cancelled:
            self.out.send({"type": P.CANCELLED, "id": rid, "task": kind})
        except KvInspectError as exc:
            self.out.send({"type": P.ERROR, "id": rid, "task": kind, "message": str(exc)})
        except Exception as exc:  # noqa: BLE001 - a bug: traceback on stderr (the window's log), one line out
            log.exception("%s failed", kind)
            what = {P.LOAD: f"could not load {req.get('spec')}", P.FETCH: f"could not fetch {req.get('name')}",
                    P.COMPARE: "comparison failed"}.get(kind, "internal error")
            self.out.send({"type": P.ERROR, "id": rid, "task": kind,
                           "message": f"{what}: {exc_line(exc)} (details in the log)"})
        finally:
            self.busy = ""

    def _do_load(self, req: dict) -> None:
        from kvinspect.core.model.loading import load_model
        from kvinspect.core.trace.messages import Note, Progress

        def progress(stage: str, frac) -> None:
            self.out.send(Progress(P.LOAD, stage, None if frac is None else float(frac)))

        loaded = load_model(req["spec"], device=req.get("device") or "auto", dtype=req.get("dtype") or "auto",
                            trust_remote_code=bool(req.get("trust_remote_code")), progress=progress,
                            cancel=self.cancel.is_set)
        # Swap only once the new model is ready: a failed or cancelled load keeps the old one usable.
        opts = P.options_from_wire(req.get("session"))
        had_one = self.session is not None
        self._close_session()
        self.loaded = None
        try:
            session = self._open_session(loaded, opts, req.get("command"))
        except KvInspectError as exc:
            if not had_one:
                raise
            raise type(exc)(f"{exc} (the previous model was unloaded)") from None
        self.session, self.loaded = session, loaded
        # RSS and accelerator figures in this stream are this process's: say which process that is.
        self.out.send(Note("engine", {"pid": os.getpid(), "host": socket.gethostname(),
                                      "python": sys.executable, "protocol": P.PROTOCOL_VERSION,
                                      "memory": "RSS and accelerator memory are the engine process's"}))
        if self.local:
            _share_cores()
        self.out.send({"type": P.LOADED, "id": req.get("id"), "info": {
            "spec": loaded.spec, "name": loaded.name, "cls": type(loaded.model).__name__, "device": loaded.device,
            "dtype": loaded.dtype, "n_layers": session.record.n_layers, "load_seconds": loaded.load_seconds,
            "notes": list(loaded.notes), "pid": os.getpid(),
        }})

    def _open_session(self, loaded, opts, command):
        from kvinspect.core.session.chat import ChatSession

        # No trace file here: the stream (header first, tokens, step blocks, turns, events, end) is the
        # one sink, and the writer thread puts it on stdout. The window writes the autosave.
        return ChatSession(loaded, opts, sinks=[self.out.send], command=command, flush_every_s=self.pace_s)

    def _close_session(self) -> None:
        s, self.session = self.session, None
        if s is not None:
            s.close()  # the stream's `end` line

    def _do_fetch(self, req: dict) -> None:
        from kvinspect.core.model.fetch import fetch
        from kvinspect.core.trace.messages import Progress

        def progress(stage: str, frac) -> None:
            self.out.send(Progress(P.FETCH, stage, None if frac is None else float(frac)))

        path = fetch(req.get("name") or "smollm2", progress=progress, cancel=self.cancel.is_set)
        self.out.send({"type": P.FETCHED, "id": req.get("id"), "path": str(path)})

    def _apply_settings(self, req: dict) -> None:
        from kvinspect.core.session.policies import check_cache_available, check_cache_impl, check_policy

        s = self._session()
        o = s.options
        policy = check_policy(req.get("policy") or o.policy)
        impl = check_cache_impl(req.get("cache_impl") or o.cache_impl)
        check_cache_available(s.loaded, impl)
        settings = P.settings_from_wire(req.get("settings"))
        if settings is not None:
            settings.validate()
            o.settings = settings
        o.policy, o.cache_impl = policy, impl
        if req.get("system") is not None:
            o.system = req["system"] or None

    def _session(self):
        if self.session is None:
            raise KvInspectError("load a model first")
        return self.session

    def _do_configure(self, req: dict) -> None:
        self._apply_settings(req)
        self.out.send({"type": P.DONE, "id": req.get("id")})

    def _do_turn(self, req: dict) -> None:
        s = self._session()
        self._apply_settings(req)
        # Tokens, step blocks, the turn line and its events reach the window through the session's stream.
        turn = s.run_turn(req.get("text", ""), should_stop=self.stop.is_set, images=req.get("images") or [])
        self.out.send({"type": P.TURN_DONE, "id": req.get("id"), "index": turn.index, "status": turn.status})

    def _do_new_chat(self, req: dict) -> None:
        if self.session is not None:
            self.session.reset()
        self.out.send({"type": P.DONE, "id": req.get("id")})

    def _do_check(self, req: dict) -> None:
        from kvinspect.core.compare.configs import parse_config, unavailable_reason

        if self.loaded is None:
            raise KvInspectError("load a model first")
        for name in req.get("names") or []:
            try:
                reason = unavailable_reason(self.loaded, parse_config(name))
            except KvInspectError as exc:
                reason = str(exc)
            except Exception as exc:  # noqa: BLE001 - a failed probe means "not here", with why
                log.exception("checking %s failed", name)
                reason = f"could not check: {exc_line(exc)}"
            self.out.send({"type": P.CHECKED, "id": req.get("id"), "name": name, "reason": reason})
        self.out.send({"type": P.DONE, "id": req.get("id")})

    def _do_compare(self, req: dict) -> None:
        from kvinspect.core.compare.report import build_report
        from kvinspect.core.compare.run import run_compare

        if self.loaded is None:
            raise KvInspectError("load a model first")
        plan = P.plan_from_wire(req["plan"])
        rid = req.get("id")

        def progress(done: int, total: int, message: str) -> None:
            self.out.send({"type": P.COMPARE_PROGRESS, "id": rid, "done": done, "total": total, "message": message})

        def on_run(result) -> None:
            self.out.send({"type": P.COMPARE_UPDATE, "id": rid, "report": build_report(result)})

        if req.get("envs"):
            # Each environment's configurations run in engine children of this engine; it only orchestrates.
            from kvinspect.engine.compare_children import ModelArgs, parse_env, run_compare_in_engines

            envs = [parse_env(f"{e['name']}=" + (f"ssh:{e['host']}:{e.get('python') or 'python3'}" if e.get("host")
                                                 else (e.get("python") or sys.executable))) for e in req["envs"]]
            model = ModelArgs(self.loaded.spec, device=self.loaded.device, dtype=self.loaded.dtype,
                              command=plan.command)
            result = run_compare_in_engines(model, plan, req["out_dir"], envs=envs, progress=progress,
                                            cancel=self.cancel.is_set, on_run=on_run)
        else:
            # The chat session's observer is idle between turns, so nothing of the comparison lands in its stream.
            result = run_compare(self.loaded, plan, req["out_dir"], progress=progress, cancel=self.cancel.is_set,
                                 on_run=on_run)
        self.out.send({"type": P.COMPARED, "id": rid, "report": build_report(result), "out_dir": str(result.out_dir)})


    def _do_compare_setup(self, req: dict) -> None:
        from kvinspect.core import env
        from kvinspect.core.compare.configs import unavailable_reason
        from kvinspect.core.compare.metrics import memory_kind
        from kvinspect.core.compare.once import default_max_cache_len, model_info

        if self.loaded is None:
            raise KvInspectError("load a model first")
        plan = P.plan_from_wire(req["plan"])
        configs = []
        for cfg in plan.configs:
            reason = unavailable_reason(self.loaded, cfg)
            cap = (plan.max_cache_len or default_max_cache_len(self.loaded)) if cfg.uses_static and not reason else None
            configs.append({"name": cfg.name, "reason": reason, "max_cache_len": cap})
        gc_impl = getattr(getattr(self.loaded.model, "generation_config", None), "cache_implementation", None)
        self.out.send({"type": P.COMPARE_READY, "id": req.get("id"), "model": model_info(self.loaded),
                       "device": self.loaded.device, "memory_kind": memory_kind(self.loaded.device),
                       "configs": configs, "cache_implementation": gc_impl, "versions": env.versions(),
                       "machine": env.machine(), "pid": os.getpid(), "host": socket.gethostname(),
                       "executable": sys.executable})

    def _do_compare_run(self, req: dict) -> None:
        """One run of one configuration into ``out_dir/dir``: the parent decides the order (interleaving)."""
        from pathlib import Path

        from kvinspect.core.compare.configs import parse_config
        from kvinspect.core.compare.once import run_once, turn_message
        from kvinspect.core.session.script import ChatScript

        if self.loaded is None:
            raise KvInspectError("load a model first")
        plan = P.plan_from_wire(req["plan"])
        assert plan.script is not None, "validate() refuses a conversation without a script"
        script = ChatScript(turns=list(plan.script.turns), system=plan.script.system, settings=plan.settings)
        cfg = parse_config(req["config"])
        rid = req.get("id")
        label = req.get("label") or req["config"]
        tag = "warm-up" if req["kind"] == "warmup" else f"r{req['repeat']}"

        def on_turn(t) -> None:
            self.out.send({"type": P.COMPARE_PROGRESS, "id": rid, "done": 1, "total": len(script.turns),
                           "message": turn_message(label, tag, t, len(script.turns))})

        run = run_once(self.loaded, plan, cfg, script, Path(req["out_dir"]), req["dir"], kind=req["kind"],
                       repeat=req["repeat"], max_cache_len=req.get("max_cache_len"), should_stop=self.cancel.is_set,
                       on_turn=on_turn)
        self.out.send({"type": P.RUN_DONE, "id": rid, "run": run.to_dict(), "cancelled": self.cancel.is_set()})


def _share_cores() -> None:
    """Run on every core, as ``kvinspect run`` does: the model's speed is the evidence.

    Measured on a 2-core machine under Xvfb (benchmarks/heartbeat.py, window_vs_cli.py): one torch
    thread left a core to the window (UI p99 16 ms) but decoded at 0.67x the CLI's speed; every core
    decodes at the CLI's speed with a UI p99 of ~22 ms. A smoother window on a small machine is a
    choice the user makes: ``KVINSPECT_TORCH_THREADS=N`` sets torch's thread count, and
    ``KVINSPECT_ENGINE_NICE=N`` lowers the engine's priority (5: UI p99 18 ms, decode ~0.7x).
    """
    want = os.environ.get("KVINSPECT_TORCH_THREADS")
    try:
        import torch

        if want:
            torch.set_num_threads(max(1, int(want)))
    except (ImportError, ValueError, RuntimeError) as exc:
        log.info("torch threads left as they are: %s", exc)
    try:
        nice = int(os.environ.get("KVINSPECT_ENGINE_NICE", "0"))
        if nice > 0 and hasattr(os, "nice"):
            os.nice(nice)
    except (ValueError, OSError) as exc:
        log.info("engine priority left as it is: %s", exc)
