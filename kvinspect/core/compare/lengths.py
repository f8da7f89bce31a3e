"""Prompt-length sweep: one turn of prefill + decode per configuration at several prompt lengths.

It shows what a StaticCache sized for the longest request costs the short ones: the static
capacity is ``max(lengths) + max_new_tokens`` (unless ``--max-cache-len`` says otherwise),
and every request, short or long, allocates and attends over that many rows. Filler prompts
are built with the model's own tokenizer and chat template so the *rendered* prompt has the
requested number of tokens (the figure prefill actually processes).
"""

from __future__ import annotations

from pathlib import Path

from kvinspect.core.compare.once import max_positions, rotated, run_once, turn_message
from kvinspect.core.compare.plan import RUNS_DIR, ComparePlan, CompareResult, ConfigResult
from kvinspect.core.errors import ScriptError
from kvinspect.core.model.loading import LoadedModel
from kvinspect.core.session.script import ChatScript

FILLER = ("The quick brown fox jumps over the lazy dog while the river keeps running towards the sea, "
          "and the old lighthouse keeper counts the ships that pass in the night. ")


def render_count(loaded: LoadedModel, text: str, system: str | None, chat_template: str | None) -> int:
    """Tokens of the rendered prompt for one user message (as the session renders it)."""
    tok = loaded.tokenizer
    msgs = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": text}]
    kw = {"chat_template": chat_template} if chat_template else {}
    rendered = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False, **kw)
    ids = tok(rendered, add_special_tokens=False)["input_ids"]
    return len(ids[0]) if ids and isinstance(ids[0], list) else len(ids)


def filler_prompt(loaded: LoadedModel, n_tokens: int, system: str | None = None,
                  chat_template: str | None = None) -> tuple[str, int]:
    """A user message whose rendered prompt has ``n_tokens`` tokens (or the nearest count below).

    Returns ``(text, rendered_tokens)``. Tokens merge at the cut, so the count is found by a
    bisection over how many filler tokens are decoded into the message.
    """
    tok = loaded.tokenizer
    ids: list[int] = []
    chunk = tok(FILLER, add_special_tokens=False)["input_ids"]
    if not chunk:
        raise ScriptError("--prompt-lengths: this tokenizer turns the filler text into no tokens")
    while len(ids) < n_tokens + 8:
        ids += chunk

    def text_of(m: int) -> str:
        return tok.decode(ids[:m], skip_special_tokens=True)

    def count(m: int) -> int:
        return render_count(loaded, text_of(m), system, chat_template)

    smallest = count(1)
    if smallest > n_tokens:
        raise ScriptError(f"--prompt-lengths: {n_tokens} tokens is shorter than the chat template's framing "
                          f"({smallest} tokens around a one-token message)")
    lo, hi = 1, len(ids)  # invariant: count(lo) <= n_tokens
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if count(mid) <= n_tokens:
            lo = mid
        else:
            hi = mid - 1
    text = text_of(lo)
    if not text.strip():
        text = text_of(lo + 1)
    return text, render_count(loaded, text, system, chat_template)


def sweep_max_cache_len(plan: ComparePlan) -> int:
    return plan.max_cache_len or (max(plan.prompt_lengths) + plan.settings.max_new_tokens)


def run_lengths(loaded: LoadedModel, plan: ComparePlan, result: CompareResult, active: list[ConfigResult],
                out: Path, tick, stop) -> None:
    """Fill ``cr.lengths`` (and ``result.length_prompts`` / ``lengths_skipped``)."""
    settings = plan.settings
    system = plan.script.system if plan.script is not None else None
    mpe = max_positions(loaded)
    cap = sweep_max_cache_len(plan)
    prompts: dict[int, str] = {}
    for n in plan.prompt_lengths:
        if mpe and n + settings.max_new_tokens > mpe:
            result.lengths_skipped.append({"length": n, "reason": f"context limit: {n} + {settings.max_new_tokens} "
                                           f"new tokens exceed the model's {mpe} positions"})
            continue
        prompts[n], result.length_prompts[n] = filler_prompt(loaded, n, system, plan.chat_template)
    lengths = sorted(prompts)
    if not lengths:
        return

    def script_for(n: int) -> ChatScript:
        return ChatScript(turns=[prompts[n]], system=system, settings=settings)

    def one(cr: ConfigResult, n: int, kind: str, k: int, rel: str):
        mcl = cap if cr.config.uses_static else None
        label = f"{n} tokens " + ("warm-up" if kind != "length" else f"r{k}")
        return run_once(loaded, plan, cr.config, script_for(n), out, rel, kind=kind, repeat=k, max_cache_len=mcl,
                        should_stop=stop, length=n, on_turn=lambda t: tick(turn_message(cr.name, label, t)))

    # Warm-up on the shortest prompt: for static+compile it compiles the decode step for this capacity.
    for cr in active:
        for w in range(plan.warmups_for(cr.config)):
            if stop():
                return
            cr.length_warmups.append(one(cr, lengths[0], "length-warmup", w + 1,
                                         f"{RUNS_DIR}/len{lengths[0]}-{cr.config.slug}-warmup{w + 1}"))
            tick.run_finished()
    for r in range(plan.repeat):
        for i, n in enumerate(rotated(lengths, r)):
            for cr in rotated(active, r + i):
                if stop():
                    return
                cr.lengths.append(one(cr, n, "length", r + 1, f"{RUNS_DIR}/len{n}-{cr.config.slug}-r{r + 1}"))
                tick.run_finished()
