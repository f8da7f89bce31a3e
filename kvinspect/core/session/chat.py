"""A chat session: one model, one cache policy, turns run through transformers' own ``generate``.

The same object runs in the CLI, in tests and in ``kvinspect engine``. Each turn renders the
whole history with the chat template, prepares the cache according to the chosen *policy* (the
correct reuse, or one of the classic mistakes, reproduced on purpose) and generates with a
forward-hook observer attached. What is measured goes to the :class:`~.pipeline.TurnPipeline`,
which finishes the turn and streams it to the record, the trace file and any other sink.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from kvinspect.core import compat, env
from kvinspect.core.cache import layer_shapes
from kvinspect.core.cache.memory import MemorySampler
from kvinspect.core.cache.observer import StepObserver
from kvinspect.core.cache.probe import CacheProbe
from kvinspect.core.detect.detectors import TurnContext, detect_turn
from kvinspect.core.detect.events import TURN_STOPPED, Event
from kvinspect.core.detect.provenance import checkpoint_file, config_sources, describe
from kvinspect.core.errors import ScriptError, first_line
from kvinspect.core.media.images import per_image, pixel_hash, read_image
from kvinspect.core.media.spans import ImageTokens, find_spans
from kvinspect.core.model.loading import LoadedModel
from kvinspect.core.session.options import SessionOptions
from kvinspect.core.session.pipeline import Failure, TurnPipeline, callback_sink
from kvinspect.core.session.policies import MEDIA_POLICIES, check_cache_available, check_cache_impl, check_policy
from kvinspect.core.session.script import GenerationSettings
from kvinspect.core.trace.record import TraceRecord, TurnRecord
from kvinspect.core.trace.stream import Sink
from kvinspect.core.trace.tracefile import TraceWriter

log = logging.getLogger(__name__)

TokenCallback = Callable[[str], None]
StopCheck = Callable[[], bool]


class _Streamer:
    """transformers streamer protocol (``put``/``end``): decodes incrementally, times the first token.

    Each token decodes only a short window: the ids since the last text sent plus the chunk before
    it, minus that chunk's own text. Decoding the whole reply every token made the per-token cost
    grow with the reply (0.4 ms a token at 2k tokens, on generate()'s thread). Starting the window
    a chunk early keeps SentencePiece's leading space and split multi-byte characters right.
    """

    def __init__(self, tokenizer, on_text: TokenCallback | None, eos_ids: set[int]):
        self.tok = tokenizer
        self.on_text = on_text
        self.eos_ids = eos_ids
        self.prompt_seen = False
        self.ids: list[int] = []
        self._visible: list[int] = []  # ids without EOS
        self._prefix = 0  # window start: the chunk before the unsent ids
        self._read = 0  # first id whose text has not been sent
        self.first_token_t: float | None = None

    def put(self, value) -> None:
        if not self.prompt_seen:  # generate() first hands over the prompt
            self.prompt_seen = True
            return
        ids = value.reshape(-1).tolist()
        if self.first_token_t is None:
            self.first_token_t = time.perf_counter()
        self.add(ids)

    def add(self, ids: list[int]) -> None:
        self.ids.extend(ids)
        self._visible.extend(i for i in ids if i not in self.eos_ids)
        vis, p, r = self._visible, self._prefix, self._read
        if len(vis) == r:
            return
        sent = self.tok.decode(vis[p:r], skip_special_tokens=True)
        text = self.tok.decode(vis[p:], skip_special_tokens=True)
        # Hold back a trailing replacement char: it is usually half of a multi-byte character.
        if text.endswith("\ufffd") or len(text) <= len(sent) or not text.startswith(sent):
            return
        self._prefix, self._read = r, len(vis)
        if self.on_text:
            self.on_text(text[len(sent):])

    def end(self) -> None:
        pass


def _stopping_criteria(should_stop: StopCheck):
    import torch
    from transformers import StoppingCriteria, StoppingCriteriaList

    class _Stop(StoppingCriteria):
        def __call__(self, input_ids, scores, **kwargs):
            hit = bool(should_stop())
            return torch.full((input_ids.shape[0],), hit, dtype=torch.bool, device=input_ids.device)

    return StoppingCriteriaList([_Stop()])


def longest_common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class ChatSession:
    """Run a conversation turn by turn and record what the KV cache does."""

    def __init__(
        self,
        loaded: LoadedModel,
        options: SessionOptions | None = None,
        *,
        record: TraceRecord | None = None,
        trace_path=None,
        on_event: Callable[[Event], None] | None = None,
        sinks: Iterable[Sink] = (),
        command: list[str] | None = None,
        flush_every_s: float = 0.5,
    ):
        self.loaded = loaded
        self.model = loaded.model
        self.tok = loaded.tokenizer
        self.options = options or SessionOptions()
        self.options.policy = check_policy(self.options.policy)
        self.options.cache_impl = check_cache_impl(self.options.cache_impl)
        self.options.settings.validate()
        self.cache_kw = compat.cache_kwarg(self.model)
        self._apply_generation_config_overrides()
        self.probe = CacheProbe(self.model.config)
        # RSS at most 4 times a second: inside generate() each read costs ~0.1 ms, over a third of the
        # hook's time (benchmarks/observer_overhead.py); the step after a long prefill still reads it.
        self.memory = MemorySampler(loaded.device, rss_every_s=0.25)
        self.record = record or TraceRecord(self.probe.n_layers, self._header(command))
        self.writer = TraceWriter(trace_path) if trace_path else None
        out = ([self.writer] if self.writer else []) + list(sinks)
        if on_event is not None:
            out.append(callback_sink(on_event=on_event))
        self.pipeline = TurnPipeline(self.record, self.probe, self.memory, out, flush_every_s=flush_every_s,
                                     max_positions=self.max_positions, model=self.model)
        self.observer = StepObserver(self.model, self.probe, self.pipeline.step, self.memory).attach()
        self.observer.enabled = False
        self.history: list[dict] = []
        self.cache = None
        self.cached_ids: list[int] = []
        # Multimodal: the processor, the conversation's pictures in order, the image each cached span was computed from.
        self.processor = getattr(loaded, "processor", None)
        self.image_tokens = ImageTokens.of(self.model.config) if self.processor is not None else None
        self.pictures: list = []
        self.picture_hashes: list[str] = []
        self.cached_media: dict[int, str] = {}  # a cached span's first position -> its pixel hash
        self._enc = None  # the processor's output for the prompt being run
        self._pending_hashes: list[str] = []  # the prompt's pictures' hashes, in order
        self.cache_opening: int | None = None  # tokens of the first prompt the current cache took
        self._gc_file: tuple[str | None, dict] | None = None  # the checkpoint's generation_config.json
        self.last_cache_id: int | None = None
        self._closed = False

    # -- setup ----------------------------------------------------------------------------
    def _apply_generation_config_overrides(self) -> None:
        """Check the overrides now; they take effect only while a turn runs (:meth:`_generation_config_scope`)."""
        gc = getattr(self.model, "generation_config", None)
        for key in self.options.generation_config or {}:
            if gc is None or not hasattr(gc, key) and key not in ("cache_implementation", "cache_config"):
                raise ScriptError(f"generation config has no field {key!r}")

    @contextlib.contextmanager
    def _generation_config_scope(self):
        """Apply the overrides to ``model.generation_config`` for one turn, then restore it.

        generate() fills every unset field of a ``generation_config=`` it is given from
        ``model.generation_config``, so the model's own object is the only place where an override,
        or clearing a colliding ``cache_implementation``, takes effect. Restoring it afterwards keeps
        the loaded model as the checkpoint made it for the next session (the GUI reuses models).
        """
        gc = getattr(self.model, "generation_config", None)
        if gc is None:
            yield
            return
        missing = object()
        keys = set(self.options.generation_config or {}) | {"cache_implementation"}
        saved = {k: copy.deepcopy(gc.__dict__.get(k, missing)) for k in keys}
        try:
            for key, value in (self.options.generation_config or {}).items():
                setattr(gc, key, value)
            yield
        finally:
            for key, value in saved.items():
                if value is missing:
                    gc.__dict__.pop(key, None)
                else:
                    setattr(gc, key, value)

    def _header(self, command: list[str] | None) -> dict:
        o = self.options
        cfg = self.model.config
        return {
            "created": env.now_iso(),
            "versions": env.versions(),
            "machine": env.machine(),
            "model": {
                "spec": self.loaded.spec,
                "name": self.loaded.name,
                "source": self.loaded.resolved.kind,
                "class": type(self.model).__name__,
                "device": self.loaded.device,
                "dtype": self.loaded.dtype,
                "load_seconds": round(self.loaded.load_seconds, 3),
                "load_s": round(self.loaded.load_seconds, 3),
                "load_source": self.loaded.load_source,
                "notes": list(self.loaded.notes),
                "config": env.cache_config(cfg),
                "generation_config": self._effective_generation_config(),
            },
            "device": self.loaded.device,
            "memory": self.memory.describe(),
            "layers": env.config_layers(cfg),
            "session": {
                "policy": o.policy,
                "cache_impl": o.cache_impl,
                "system": o.system,
                "chat_template": o.chat_template_name,
                # The text too: a report bundles it so the run reproduces on another machine.
                "chat_template_text": o.chat_template,
                "max_cache_len": o.max_cache_len,
                "generation_config_overrides": dict(o.generation_config),
                "respect_generation_config": o.respect_generation_config,
                "settings": o.settings.to_dict(),
            },
            "command": command,
        }

    def _effective_generation_config(self) -> dict:
        with self._generation_config_scope():
            return env.generation_config(self.model)

    # -- cache preparation --------------------------------------------------------------------
    @property
    def max_positions(self) -> int | None:
        return compat.max_positions(self.model.config)

    @property
    def max_cache_len(self) -> int:
        if self.options.max_cache_len:
            return int(self.options.max_cache_len)
        mpe = getattr(compat.text_config(self.model.config), "max_position_embeddings", None) or 2048
        return int(min(mpe, 2048))

    def check_cache_impl_available(self, impl: str | None = None) -> None:
        check_cache_available(self.loaded, impl or self.options.cache_impl)

    def new_cache(self, with_config: bool = True):
        impl = self.options.cache_impl
        self.check_cache_impl_available(impl)
        cfg = self.model.config
        if not with_config:
            return compat.new_dynamic_cache(None)
        if impl == "dynamic":
            return compat.new_dynamic_cache(cfg)
        if impl == "offloaded":
            return compat.new_dynamic_cache(cfg, offloading=True)
        if impl == "static":
            return compat.new_static_cache(cfg, self.max_cache_len)
        backend = compat.quantized_backends()[0]
        return compat.new_quantized_cache(cfg, backend)

    def _prepare_reuse(self, prompt: list[int], ctx: TurnContext, with_config: bool = True) -> None:
        """The correct recipe: keep the cache, crop to the common prefix, recreate if cropping fails."""
        if self.cache is None:
            self.cache = self.new_cache(with_config)
            self.cached_ids = []
            ctx.created_reason = "first turn" if not ctx.turn_index else "no cache to reuse"
            return
        cur = len(self.cached_ids)
        lcp = self._media_prefix(prompt, longest_common_prefix(self.cached_ids, prompt), ctx)
        p = min(lcp, len(prompt) - 1)
        if lcp < cur:
            ctx.divergence_at = lcp
        stuck = layer_shapes.uncroppable_state_layers(self.cache) if p < cur else []
        if stuck:
            # Never crop (or continue) a recurrent state: it already folded in the dropped tokens.
            ctx.state_not_croppable = stuck
            ctx.crop_error = "a recurrent state cannot be rolled back to a shorter prefix"
            self.cache = self.new_cache(with_config)
            self.cached_ids = []
            ctx.created_reason = "state_not_croppable: the recurrent state cannot be rolled back: full re-prefill"
        elif p < cur:
            try:
                compat.crop(self.cache, p)
                self.probe.resync(self.cache)
                self.cached_ids = self.cached_ids[:p]
                ctx.cropped_from, ctx.cropped_to = cur, p
            except (ValueError, RuntimeError, NotImplementedError) as exc:
                ctx.crop_error = first_line(exc)
                self.cache = self.new_cache(with_config)
                self.cached_ids = []
                ctx.created_reason = "cropping impossible (sliding layers past their window): full re-prefill"
        ctx.reused = len(self.cached_ids)

    def _media_prefix(self, prompt: list[int], lcp: int, ctx: TurnContext) -> int:
        """The common prefix, ended at an image's first token where the ids agree but the picture does not, or
        where it would cut the image's span (an image's tokens are fed together)."""
        if self.image_tokens is None:
            return lcp
        hashes = self._pending_hashes
        for k, sp in enumerate(find_spans(prompt, self.image_tokens)):
            if sp.first >= lcp:
                break
            held = self.cached_media.get(sp.first)
            if held is not None and k < len(hashes) and hashes[k] != held and sp.last < lcp:
                ctx.media_changed = {"image": k, "first": sp.first, "last": sp.last, "cached_hash": held,
                                     "given_hash": hashes[k]}
                return sp.first
            if sp.last >= lcp:
                return sp.first
        return lcp

    # -- a turn -----------------------------------------------------------------------------
    def run_turn(self, user_text: str, on_token: TokenCallback | None = None,
                 should_stop: StopCheck | None = None, images: Sequence[str | Path] = ()) -> TurnRecord:
        """One turn; ``images``: picture files sent with the message (a vision-language model's processor takes them)."""
        if self._closed:
            raise RuntimeError("session is closed")
        if not isinstance(user_text, str) or not user_text.strip():
            raise ScriptError("a turn needs a non-empty user message")
        if images and self.processor is None:
            raise ScriptError(f"{self.loaded.name} takes no images (it has no processor); load a vision-language "
                              "model such as tiny-gemma3-vl")
        new_pictures = [read_image(p) for p in images]
        o = self.options
        policy, impl = check_policy(o.policy), check_cache_impl(o.cache_impl)
        o.policy, o.cache_impl = policy, impl
        if policy in MEDIA_POLICIES and self.processor is None:
            raise ScriptError(f"the {policy} policy shows an image mistake: it needs a vision-language model "
                              "(tiny-gemma3-vl)")
        o.settings.validate()
        index = len(self.record.turns)
        turn = TurnRecord(index=index, user=user_text, policy=policy, cache_impl=impl,
                          first_step=self.record.n_steps,
                          settings={**o.settings.to_dict(), "config_sources": self._config_sources()})
        if images:
            turn.settings["images"] = [str(p) for p in images]
        content = self._content(user_text, len(new_pictures))
        messages = self._messages(content)
        pictures = self.pictures + new_pictures
        prompt = self._render(messages, pictures, as_text=policy == "image-as-text")
        limit = self.max_positions
        if limit and len(prompt) > 2 * limit:
            # Up to the limit and a little past it the turn runs (past it, context_limit shows how a RoPE
            # model degrades); beyond twice it no output means anything and the prefill's cost, quadratic
            # in the prompt, is minutes or all the memory: refused before generate() builds anything.
            # Only the prompt counts: max_new_tokens is a ceiling, and a turn usually stops well before it.
            raise ScriptError(f"context limit: turn {index + 1}'s prompt is {len(prompt):,} tokens, more than "
                              f"twice the model's {limit:,} positions (max_position_embeddings); shorten the "
                              "turn or the conversation")
        turn.prompt_tokens = len(prompt)
        turn.prompt_ids = prompt
        ctx = TurnContext(turn_index=index, policy=policy, cache_impl=impl,
                          cached_before=len(self.cached_ids), prompt=prompt,
                          prev_cache_id=self.last_cache_id, cached_ids_before=list(self.cached_ids),
                          decode=lambda ids: self.tok.decode(ids, skip_special_tokens=False),
                          opening=self.cache_opening if self.cached_ids else None,
                          special_ids=frozenset(getattr(self.tok, "all_special_ids", None) or ()))
        self._pending_hashes = []
        if self._enc is not None:
            ctx.media_known = self._pending_hashes = self._hashes(pictures)
            ctx.media_sizes = [[int(p.shape[1]), int(p.shape[0])] for p in pictures]
        self.pipeline.begin(turn)
        stop = should_stop or (lambda: False)

        def on_text(text: str) -> None:
            if on_token is not None:
                on_token(text)
            self.pipeline.token(text)

        streamer = _Streamer(self.tok, on_text, self._eos_ids())
        t0 = time.perf_counter()
        new_ids: list[int] = []
        failed_cache = None
        error: BaseException | None = None
        # What the cache holds as it is handed to the call, to explain a failure: measured after it, a
        # cache the failing forward half wrote can read as holding the whole prompt.
        held = _cached_length(self.cache)
        try:
            self.observer.enabled = True
            with self._generation_config_scope():
                if policy == "refeed":
                    new_ids = self._run_refeed(prompt, ctx, streamer, stop)
                else:
                    new_ids = self._run_generate(prompt, ctx, streamer, stop)
            turn.status = "stopped" if stop() else "ok"
        except Exception as exc:  # noqa: BLE001 - a failed turn is recorded, never fatal
            error = exc
            log.debug("turn %d failed", index + 1, exc_info=not isinstance(exc, (ValueError, IndexError, RuntimeError)))
            # What was generated before the failure still counts (and shows in the turn's numbers).
            new_ids = list(streamer.ids)
            # The cache may be half-updated: drop it, the next turn starts clean (and says so).
            # The dropped object is still measured once, so the turn shows what it held when it failed.
            failed_cache = self.cache
            self.cache = None
            self.cached_ids = []
        finally:
            self.observer.enabled = False
        t1 = time.perf_counter()
        self._finish_turn(turn, ctx, new_ids, streamer, t0, t1, error, failed_cache, content, new_pictures, held)
        if error is not None:
            log.info("turn %d failed: %s", index + 1, turn.error)
        return turn

    @staticmethod
    def _content(user_text: str, n_pictures: int):
        """A message's content: the text, or (with pictures) the image parts first, then the text."""
        if not n_pictures:
            return user_text
        return [{"type": "image"} for _ in range(n_pictures)] + [{"type": "text", "text": user_text}]

    def _messages(self, content) -> list[dict]:
        msgs = []
        if self.options.system:
            msgs.append({"role": "system", "content": self.options.system})
        return msgs + self.history + [{"role": "user", "content": content}]

    def _hashes(self, pictures: list) -> list[str]:
        """Each picture's hash over the pixels the vision tower gets (the processor's, in the model's dtype)."""
        enc = self._enc
        px = enc.get("pixel_values") if enc is not None else None
        images = per_image(px, enc.get("image_grid_thw") if enc is not None else None)
        if len(images) != len(pictures):
            return []
        # Every picture each turn, not only the new ones: one the program changed must not pass for the cached one.
        dtype = self.model.dtype
        return [pixel_hash(img.to(dtype)) for img in images]

    def _render(self, messages: list[dict], pictures: list | None = None, as_text: bool = False) -> list[int]:
        kw = {}
        if self.options.chat_template:
            kw["chat_template"] = self.options.chat_template
        try:
            out = self.tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False, **kw)
        except Exception as exc:  # noqa: BLE001 - Jinja errors come in many types
            raise ScriptError(f"the chat template failed to render: {first_line(exc)}") from None
        self._enc = None
        if self.processor is not None and not as_text:
            # The processor expands each image placeholder into the image's span and makes the pixels and
            # token types that go with the ids; the ids are the whole conversation's, as for a text model.
            try:
                enc = self.processor(text=out, images=list(pictures or []) or None, return_tensors="pt")
            except ValueError as exc:
                raise ScriptError(f"the processor refused the turn: {first_line(exc)}") from None
            self._enc = enc
            return [int(i) for i in enc["input_ids"][0].tolist()]
        ids = self.tok(out, add_special_tokens=False)["input_ids"]
        if ids and isinstance(ids[0], list):
            ids = ids[0]
        return [int(i) for i in ids]

    def _eos_ids(self) -> set[int]:
        eos = getattr(self.model.generation_config, "eos_token_id", None)
        if eos is None:
            eos = self.tok.eos_token_id
        if eos is None:
            return set()
        return set(eos) if isinstance(eos, (list, tuple)) else {int(eos)}

    def _gen_kwargs(self, streamer, stop) -> dict:
        import torch

        s = self.options.settings
        kw = dict(max_new_tokens=s.max_new_tokens, do_sample=s.do_sample, streamer=streamer,
                  stopping_criteria=_stopping_criteria(stop), return_dict_in_generate=True)
        if s.do_sample:
            kw.update(temperature=s.temperature, top_p=s.top_p, top_k=s.top_k)
            if s.seed is not None:
                torch.manual_seed(s.seed)
        else:
            # Greedy: clear sampling knobs a checkpoint's generation_config may carry (avoids warnings).
            kw.update(temperature=None, top_p=None, top_k=None)
        if self.tok.pad_token_id is not None and getattr(self.model.generation_config, "pad_token_id", None) is None:
            kw["pad_token_id"] = self.tok.pad_token_id
        return kw

    def _config_sources(self) -> dict:
        """Where cache_implementation / cache_config / use_cache come from (outside the override scope)."""
        if self._gc_file is None:
            self._gc_file = checkpoint_file(self.model)
        return config_sources(self.model, overrides=self.options.generation_config, file=self._gc_file)

    def _generation_config_for_call(self, passing_cache: bool, ctx: TurnContext):
        """Detect a checkpoint ``cache_implementation`` that collides with our cache; clear it unless told not to."""
        gc = self.model.generation_config
        impl = getattr(gc, "cache_implementation", None)
        if not impl or not passing_cache:
            return None
        ctx.config_collision = str(impl)
        ctx.config_source = describe(self._config_sources().get("cache_implementation"))
        if self.options.respect_generation_config:
            return None
        # Cleared on the model's own config (restored after the turn by _generation_config_scope):
        # a cleared copy passed as generation_config= would be refilled from it by generate().
        gc.cache_implementation = None
        ctx.config_cleared = True
        return None

    def _run_generate(self, prompt: list[int], ctx: TurnContext, streamer, stop) -> list[int]:
        import torch

        policy = ctx.policy
        use_cache = True
        cache = None
        if policy == "reuse" or policy in MEDIA_POLICIES:
            self._prepare_reuse(prompt, ctx)
            cache = self.cache
        elif policy == "cache-without-config":
            self._prepare_reuse(prompt, ctx, with_config=False)
            cache = self.cache
        elif policy == "recreate":
            self.cache = cache = self.new_cache()
            self.cached_ids = []
            ctx.created_reason = "recreate policy: a new cache object every turn"
        elif policy == "nocache":
            self.cache = None
            self.cached_ids = []
            use_cache = False
        elif policy == "cache-and-use-cache-false":
            if self.cache is None:
                self.cache = self.new_cache()
            cache = self.cache
            use_cache = False
        ctx.reused = len(self.cached_ids) if cache is not None and use_cache else 0
        dev = self.loaded.input_device
        ids = torch.tensor([prompt], dtype=torch.long, device=dev)
        kw = self._gen_kwargs(streamer, stop)
        kw["attention_mask"] = torch.ones_like(ids)
        kw.update(self._media_inputs(prompt, ctx.reused, dev, policy))
        kw["use_cache"] = use_cache
        if cache is not None:
            kw[self.cache_kw] = cache
        gc = self._generation_config_for_call(cache is not None, ctx)
        if gc is not None:
            kw["generation_config"] = gc
        with torch.inference_mode():
            out = self.model.generate(ids, **kw)
        seq = out["sequences"] if hasattr(out, "keys") else out
        new = seq[0, len(prompt):].tolist()
        if cache is not None and use_cache:
            # generate() never feeds the last sampled token back: the cache is one short.
            if not ctx.reused:
                self.cache_opening = len(prompt)
            self.cached_ids = prompt + new[:-1]
        elif cache is not None:
            self.cached_ids = []  # what the cache holds no longer matches any token list
        return new

    def _media_inputs(self, prompt: list[int], reused: int, dev, policy: str = "reuse") -> dict:
        """The processor's token types for the whole prompt, and the pixels of only the images after the cached
        prefix: the cached ones are already in the cache's rows (encoding them again fails the call)."""
        enc = self._enc
        if enc is None or self.image_tokens is None:
            return {}
        kw = {}
        for key in ("token_type_ids", "mm_token_type_ids"):
            if key in enc and policy != "image-no-token-types":
                kw[key] = enc[key].to(dev)
        px = enc.get("pixel_values")
        grid = enc.get("image_grid_thw")
        if grid is not None:
            kw["image_grid_thw"] = grid.to(dev)  # every image's: M-RoPE positions are computed over the whole prompt
        if px is not None and policy == "images-again":
            kw["pixel_values"] = px.to(dev, self.model.dtype)  # the mistake: the cached pictures too
        elif px is not None:
            spans = find_spans(prompt, self.image_tokens)
            images = per_image(px, grid)
            keep = [k for k, sp in enumerate(spans) if sp.first >= reused]
            if keep and len(spans) == len(images) and (grid is None or keep[0] == 0):
                kw["pixel_values"] = px[keep[0]:].to(dev, self.model.dtype)
            elif keep and len(spans) == len(images):
                # Qwen2-VL: the grids of every image (for the positions), the features of only the uncached ones,
                # from the model's own vision tower (pixels with a partial grid would not match the grids).
                import torch

                rows = sum(int(img.shape[0]) for img in images[:keep[0]])
                with torch.inference_mode():
                    kw["mm_encoder_outputs"] = {"image": self.model.get_image_features(
                        pixel_values=px[rows:].to(dev, self.model.dtype), image_grid_thw=grid[keep[0]:].to(dev),
                        return_dict=True)}
        return kw

    def _run_refeed(self, prompt: list[int], ctx: TurnContext, streamer, stop) -> list[int]:
        """The classic mistake (b): re-encode the whole history onto the reused cache by hand."""
        import torch

        if self.cache is None:
            self.cache = self.new_cache()
            self.cached_ids = []
            ctx.created_reason = "first turn"
        cache = self.cache
        ctx.reused = 0
        s = self.options.settings
        dev = self.loaded.input_device
        gen = None
        if s.do_sample and s.seed is not None:
            gen = torch.Generator(device="cpu").manual_seed(s.seed)
        suppress = list(getattr(self.model.generation_config, "suppress_tokens", None) or [])
        eos = self._eos_ids()
        new: list[int] = []
        ids = torch.tensor([prompt], dtype=torch.long, device=dev)
        with torch.inference_mode():
            for _ in range(s.max_new_tokens):
                out = self.model(input_ids=ids, use_cache=True, **{self.cache_kw: cache})
                logits = out.logits[0, -1].float()
                if suppress:
                    logits[suppress] = float("-inf")
                nxt = _pick(logits, s, gen)
                if streamer.first_token_t is None:
                    streamer.first_token_t = time.perf_counter()
                new.append(nxt)
                streamer.add([nxt])
                if nxt in eos or stop():
                    break
                ids = torch.tensor([[nxt]], dtype=torch.long, device=dev)
        self.cached_ids = []  # duplicated context: no token list describes it any more
        return new

    def _finish_turn(self, turn: TurnRecord, ctx: TurnContext, new_ids, streamer, t0, t1,
                     error: BaseException | None, failed_cache=None, content=None, new_pictures=(),
                     held: int | None = None) -> None:
        eos = self._eos_ids()
        reply_ids = [i for i in new_ids if i not in eos]
        turn.reply = self.tok.decode(reply_ids, skip_special_tokens=True) if reply_ids else ""
        turn.divergence_at, turn.cropped_from = ctx.divergence_at, ctx.cropped_from
        # A failed turn's cache was dropped; it is still measured once, to show what it held when it failed.
        cache = self.cache if self.cache is not None else failed_cache
        snap = None
        if cache is not None:
            try:
                snap = self.probe.snapshot(cache)
            except Exception:  # noqa: BLE001 - a cache broken by the failure is simply not shown
                if cache is not failed_cache:
                    raise
                log.debug("could not measure the cache of the failed turn", exc_info=True)

        def stopped(t: TurnRecord) -> list[Event]:
            if t.status != "stopped":
                return []
            return [Event(TURN_STOPPED, "info", t.index, max(t.end_step - 1, t.first_step),
                          f"stopped by the user after {t.new_tokens} new tokens; the cache holds "
                          f"{len(self.cached_ids)} tokens, consistent with the kept reply",
                          "Nothing to do: the next turn reuses the cache as usual.")]

        self.pipeline.finish(turn, ctx, new_ids=new_ids, snapshot=snap, t_start=t0, t_first=streamer.first_token_t,
                             t_end=t1, detect=detect_turn,
                             failure=Failure.of(error) if error is not None else None,
                             held=held if error is not None else None,
                             extra_events=stopped)
        if turn.status != "failed":
            self.history += [{"role": "user", "content": turn.user if content is None else content},
                             {"role": "assistant", "content": turn.reply}]
            self.pictures += list(new_pictures)
            self.picture_hashes = list(self._pending_hashes)
            self.cached_media = {m["first"]: m["hash"] for m in turn.media} if self.cached_ids else {}
            if turn.cache_id:
                self.last_cache_id = turn.cache_id
        else:
            # kvinspect discarded the cache itself: the next turn's new object is not the user's doing.
            self.last_cache_id = None

    # -- lifetime -----------------------------------------------------------------------------
    def reset(self) -> None:
        """Forget the conversation and the cache (a new chat, same record)."""
        self.history = []
        self.cache = None
        self.cached_ids = []
        self.pictures, self.picture_hashes, self.cached_media = [], [], {}
        self.last_cache_id = None  # a new chat's new cache is not a "recreated" one

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.observer.detach()
        self.pipeline.close()

    def __enter__(self) -> ChatSession:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _cached_length(cache) -> int | None:
    if cache is None:
        return None
    try:
        return int(cache.get_seq_length())
    except Exception:  # noqa: BLE001 - only used to explain a failure
        return None


def _pick(logits, s: GenerationSettings, gen) -> int:
    import torch

    if not s.do_sample:
        return int(torch.argmax(logits))
    logits = logits / max(s.temperature, 1e-5)
    if s.top_k:
        kth = torch.topk(logits, min(s.top_k, logits.numel())).values[-1]
        logits = torch.where(logits < kth, torch.full_like(logits, float("-inf")), logits)
    probs = torch.softmax(logits, -1)
    if s.top_p < 1:
        sp, si = torch.sort(probs, descending=True)
        keep = torch.cumsum(sp, -1) - sp < s.top_p
        mask = torch.zeros_like(probs, dtype=torch.bool)
        mask[si[keep]] = True
        probs = torch.where(mask, probs, torch.zeros_like(probs))
        probs = probs / probs.sum()
    return int(torch.multinomial(probs.cpu(), 1, generator=gen))
