"""Zero-edit tracing: observe every causal LM a program runs, without changing the program.

``kvinspect trace -- python my_script.py`` starts the script with ``kvinspect/core/observe/_trace_boot``
first on its ``PYTHONPATH``; the ``sitecustomize`` there calls :func:`arm` before the script's
first line. :func:`arm` imports nothing heavy. It adds an import hook that waits for ``torch``,
then uses one documented torch extension point, the global *module registration* hook
(``torch.nn.modules.module.register_module_module_registration_hook``). That hook runs while
models are being **built** (a child module assigned to its parent), never during a forward
pass, so modules other than causal LMs cost nothing at run time. When the parent is a
transformers causal LM, a forward pre-hook goes on that model; at its first top-level call a
:class:`~.model_observer.ModelObserver` starts appending to ``DIR/trace*.jsonl``.

At exit (normal end, ``sys.exit``, or an uncaught exception) every open turn is closed and
every trace gets its ``end`` line; a crash marks the turn it hit as failed and adds a note.
A forked child stops observing (it must not write into the parent's files).
"""

from __future__ import annotations

import atexit
import importlib.abc
import importlib.util
import os
import sys
import threading
import weakref
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

from kvinspect.core.errors import exc_line

if TYPE_CHECKING:
    from kvinspect.core.observe.live import Ticker

ENV_DIR = "KVINSPECT_TRACE_DIR"  # where traces go; set by `kvinspect trace` for the child
ENV_PKG = "KVINSPECT_TRACE_PKG"  # the folder holding the kvinspect package, for a Python that lacks it

_active: Tracer | None = None


def is_causal_lm_class(cls: type) -> bool:
    """A transformers model class that can generate (by MRO names: importing transformers is not needed)."""
    names = {c.__name__ for c in cls.__mro__ if c.__module__.startswith("transformers")}
    return "PreTrainedModel" in names and "GenerationMixin" in names


def claim_trace_path(out_dir: Path, name: str, draft: bool = False) -> Path:
    """``trace.jsonl`` for the first model of the run, ``trace-<name>[-N].jsonl`` after; atomic across processes.

    A draft model (``assistant_model=`` of another model's ``generate()``) runs before the model the user
    called, and never gets ``trace.jsonl``: ``trace-<name>-draft[-N].jsonl``."""
    from kvinspect.core.observe.header import slug

    out_dir.mkdir(parents=True, exist_ok=True)
    s = slug(name) + ("-draft" if draft else "")
    names = ([] if draft else ["trace.jsonl"]) + [f"trace-{s}.jsonl"] + [f"trace-{s}-{i}.jsonl" for i in range(2, 1000)]
    for n in names:
        p = out_dir / n
        try:
            fd = os.open(p, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            continue
        os.close(fd)
        return p
    raise OSError(f"too many traces in {out_dir}")


class Tracer:
    """Finds causal LMs as they are built and observes each one from its first call."""

    def __init__(self, out_dir: str | os.PathLike, command: list[str] | None = None):
        self.out_dir = Path(out_dir)
        self.command = command
        self.pid = os.getpid()
        self.enabled = True
        self._verdicts: dict[type, bool] = {}
        self._hooked: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._towers: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> its vision tower's hook
        self._observers: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._ignored: weakref.WeakSet = weakref.WeakSet()
        self.observers: list = []  # strong references: every trace is finished at exit
        self._lock = threading.RLock()
        self._ticker: Ticker | None = None
        self._reg_handle: Any = None  # torch's RemovableHandle
        self._warned = False
        self._compiling: Any = None  # torch's is_compiling, once torch is imported

    # -- torch side --------------------------------------------------------------------------------
    def install_torch_hooks(self) -> None:
        from torch.nn.modules.module import register_module_module_registration_hook

        from kvinspect.core.compat import compiling_test

        self._compiling = compiling_test()
        if self._reg_handle is None:
            self._reg_handle = register_module_module_registration_hook(self._on_registration)

    def remove_torch_hooks(self) -> None:
        if self._reg_handle is not None:
            self._reg_handle.remove()
            self._reg_handle = None
        for hooks in (self._hooked, self._towers):
            for handle in list(hooks.values()):
                handle.remove()
            hooks.clear()

    def _on_registration(self, module, name, submodule):
        # Runs for every child assigned while any model is built: keep it to a dict lookup.
        if not self.enabled:
            return None
        t = type(module)
        verdict = self._verdicts.get(t)
        if verdict is None:
            verdict = self._verdicts[t] = is_causal_lm_class(t)
        if verdict:
            if module not in self._hooked:
                self._hooked[module] = module.register_forward_pre_hook(self._lazy_pre, with_kwargs=True)
            if module not in self._towers:
                self._hook_tower(module)
        return None

    def _hook_tower(self, model) -> None:
        """A multimodal model's vision tower starts its observer too: ``generate()`` may encode the images
        (``get_image_features``) before the model's first forward, and those calls are the turn's."""
        from kvinspect.core.media.watch import vision_tower

        tower = vision_tower(model)
        if tower is not None:
            ref = weakref.ref(model)
            self._towers[model] = tower.register_forward_pre_hook(
                lambda mod, args, kwargs: self._tower_pre(ref, mod, args, kwargs), with_kwargs=True)

    def _tower_pre(self, ref, tower, args, kwargs):
        if (self._compiling is not None and self._compiling()) or not self.enabled:
            return None
        model = ref()
        if model is None or model in self._observers or model in self._ignored:
            return None  # a running observer's own hook on the tower reads this call
        try:
            obs = self._start(model)
            media = obs.pipeline.media if obs is not None else None
            if media is not None:
                media.see_tower_call(args, kwargs)  # its hook went on during this call: torch runs it from the next
        except Exception as exc:  # noqa: BLE001 - never break the traced program
            self._ignored.add(model)
            self._warn(f"cannot observe {type(model).__name__}: {exc_line(exc)}")
        return None

    def watch(self, model) -> None:
        """Observe ``model`` from its next call (a model built before the tracer was armed)."""
        if self._compiling is None:
            from kvinspect.core.compat import compiling_test

            self._compiling = compiling_test()
        if model not in self._hooked:
            self._hooked[model] = model.register_forward_pre_hook(self._lazy_pre, with_kwargs=True)
        if model not in self._towers:
            self._hook_tower(model)

    def _lazy_pre(self, module, args, kwargs):
        if (self._compiling is not None and self._compiling()) or not self.enabled:
            return None
        obs = self._observers.get(module)
        if obs is None:
            if module in self._ignored:
                return None
            try:
                obs = self._start(module)
            except Exception as exc:  # noqa: BLE001 - never break the traced program
                self._ignored.add(module)
                self._warn(f"cannot observe {type(module).__name__}: {exc_line(exc)}")
                return None
            if obs is None:
                return None
        obs.before_forward(args, kwargs)
        return None

    def _start(self, module):
        from kvinspect.core.observe.header import model_name
        from kvinspect.core.observe.live import Ticker
        from kvinspect.core.observe.model_observer import ModelObserver

        with self._lock:
            obs = self._observers.get(module)
            if obs is not None:
                return obs
            if getattr(module.config, "is_encoder_decoder", False) or self._nested():
                self._ignored.add(module)
                return None
            from kvinspect.core.observe.turns import drafting_for

            draft = drafting_for(module) is not None
            path = claim_trace_path(self.out_dir, model_name(module), draft=draft)
            obs = ModelObserver(module, trace_path=path, mode="trace", command=self.command,
                                role="draft" if draft else None)
            obs.attach(pre_hook=False)  # our lazy pre-hook already calls before_forward
            self._observers[module] = obs
            self.observers.append(obs)
            if self._ticker is None:
                self._ticker = Ticker()
            self._ticker.add(obs)
            return obs

    def _nested(self) -> bool:
        """Is an observed model's forward already on the stack (a causal LM inside another)?"""
        codes = set()
        for obs in self.observers:
            codes |= obs.forward_codes
        if not codes:
            return False
        f: FrameType | None = sys._getframe(2)
        while f is not None:
            if f.f_code in codes:
                return True
            f = f.f_back
        return False

    def _warn(self, msg: str) -> None:
        if not self._warned:
            self._warned = True
            print(f"kvinspect: {msg}", file=sys.stderr)

    # -- process side ------------------------------------------------------------------------------
    def finish(self) -> None:
        """At exit: close every open turn (failed if the uncaught exception went through it) and every trace."""
        if os.getpid() != self.pid or not self.enabled:
            return
        self.enabled = False
        if self._ticker is not None:
            self._ticker.stop()
        exc = getattr(sys, "last_value", None)
        tb = getattr(sys, "last_traceback", None)
        for obs in list(self.observers):
            status, error, notes = "ok", "", {}
            if exc is not None:
                err = exc_line(exc)
                notes["crash"] = {"error": err, "in_turn": bool(obs.turn is not None and obs.turn_hit_by(tb))}
                if notes["crash"]["in_turn"]:
                    status = "interrupted" if isinstance(exc, KeyboardInterrupt) else "failed"
                    error = err
            try:
                obs.finish(status, error, notes=notes)
            except Exception as e:  # noqa: BLE001 - exit must go on
                self._warn(f"could not finish a trace: {e}")

    def after_fork_in_child(self) -> None:
        # The child shares the parent's open files: it must never write to them.
        self.enabled = False
        for obs in self.observers:
            obs.enabled = False
            obs.steps.enabled = False
            obs.forget_outputs()
        self._ticker = None


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs ``callback`` right after the module ``name`` finishes importing (once).

    It stays in ``sys.meta_path`` until the module has really been executed: a probe such as
    transformers' ``importlib.util.find_spec("torch")`` (is_torch_available) asks finders too, and a
    finder that left at the probe missed the import that followed, so a program that imported
    transformers before torch was never traced.
    """

    def __init__(self, name: str, callback):
        self.name = name
        self.callback = callback
        self._asking = False

    def find_spec(self, fullname, path=None, target=None):
        if fullname != self.name or self._asking:
            return None
        self._asking = True  # the real finders answer the question below, not this one again
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            self._asking = False
        if spec is not None and spec.loader is not None and hasattr(spec.loader, "exec_module"):
            spec.loader = _CallbackLoader(spec.loader, self.callback, self)
        return spec


class _CallbackLoader(importlib.abc.Loader):
    def __init__(self, real, callback, finder=None):
        self.real = real
        self.callback = callback
        self.finder = finder

    def create_module(self, spec):
        return self.real.create_module(spec)

    def exec_module(self, module):
        module.__loader__ = self.real  # the module keeps its true loader
        if getattr(module, "__spec__", None) is not None:
            module.__spec__.loader = self.real
        self.real.exec_module(module)
        if self.finder is not None and self.finder in sys.meta_path:
            sys.meta_path.remove(self.finder)
        try:
            self.callback()
        except Exception as exc:  # noqa: BLE001 - tracing is optional, the program is not
            print(f"kvinspect: tracing disabled: {exc_line(exc)}", file=sys.stderr)


def arm(out_dir: str | os.PathLike, command: list[str] | None = None) -> Tracer:
    """Start tracing this process into ``out_dir`` (called by the boot ``sitecustomize``)."""
    global _active
    if _active is not None:
        return _active
    if command is None:
        command = ["kvinspect", "trace", "--", *getattr(sys, "orig_argv", sys.argv)]
    tracer = _active = Tracer(out_dir, command)
    # The trace header names the platform, and platform() runs `uname -p` once a process: its subprocess
    # enters warnings.catch_warnings(), which resets every module's warning registry, so the program's own
    # warning printed once would print again at the next call. Before the program's first line, it resets nothing.
    import platform

    platform.platform(terse=True)
    if "torch" in sys.modules:
        tracer.install_torch_hooks()
    else:
        sys.meta_path.insert(0, _AfterImport("torch", tracer.install_torch_hooks))
    atexit.register(tracer.finish)
    if hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=tracer.after_fork_in_child)
    return tracer


def active() -> Tracer | None:
    """The tracer of this process, when it runs under ``kvinspect trace``."""
    return _active
