"""Long-conversation stress: extend one conversation until each configuration fails, or MAX turns.

The script's turns are cycled. A configuration *fails* at the first turn that fails (a static
cache overflow, out of memory, any error from generate) or that takes the conversation past
the model's ``max_position_embeddings`` (a context limit: RoPE models do not raise there, they
silently degrade, so the limit is checked from the token counts). What is reported per
configuration is the turn and the token count at which that happened: the seed article's
"failure rate of long conversations", measured.
"""

from __future__ import annotations

from pathlib import Path

from kvinspect.core.compare.metrics import CONTEXT_LIMIT, failure_kind
from kvinspect.core.compare.once import max_positions, run_once, turn_message
from kvinspect.core.compare.plan import RUNS_DIR, ComparePlan, ConfigResult
from kvinspect.core.model.loading import LoadedModel
from kvinspect.core.session.script import ChatScript
from kvinspect.core.trace.record import TurnRecord


def cycled_script(plan: ComparePlan, n_turns: int) -> ChatScript:
    base = plan.script
    assert base is not None, "validate() refuses the stress mode without a script"
    turns = [base.turns[i % len(base.turns)] for i in range(n_turns)]
    return ChatScript(turns=turns, system=base.system, settings=plan.settings)


def run_stress(loaded: LoadedModel, plan: ComparePlan, active: list[ConfigResult], out: Path, tick, stop) -> None:
    """Fill ``cr.stress`` for every active configuration (one run each, one after another)."""
    max_turns = plan.turns_until_failure
    assert max_turns is not None, "run_stress runs only with --turns-until-failure"
    script = cycled_script(plan, max_turns)
    mpe = max_positions(loaded)
    max_new = plan.settings.max_new_tokens
    for cr in active:
        if stop():
            return
        failure: dict = {}

        def on_turn(t: TurnRecord, cr=cr, failure=failure) -> None:
            tick(turn_message(cr.name, "stress", t, max_turns))
            if failure:
                return
            if t.status == "failed":
                failure.update(turn=t.index + 1, kind=failure_kind(t.error), reason=t.error,
                               prompt_tokens=t.prompt_tokens, tokens=t.prompt_tokens + max_new)
            elif t.status == "ok" and mpe and t.prompt_tokens + t.new_tokens > mpe:
                total = t.prompt_tokens + t.new_tokens
                failure.update(turn=t.index + 1, kind=CONTEXT_LIMIT, prompt_tokens=t.prompt_tokens, tokens=total,
                               reason=f"context limit: the conversation reached {total} tokens but the model "
                                      f"has {mpe} positions (max_position_embeddings)")

        def should_stop(failure=failure) -> bool:
            return bool(failure) or stop()

        run = run_once(loaded, plan, cr.config, script, out, f"{RUNS_DIR}/{cr.config.slug}-stress",
                       kind="stress", repeat=1, max_cache_len=cr.max_cache_len,
                       should_stop=should_stop, on_turn=on_turn)
        ok = [t for t in run.turns if t["status"] == "ok"]
        if failure and failure["kind"] == CONTEXT_LIMIT:
            ok = ok[:-1]  # the turn that crossed the limit is the failing one
        last = ok[-1] if ok else None
        if failure:
            status = "failed"
        elif len(run.turns) >= max_turns and all(t["status"] == "ok" for t in run.turns):
            status = "survived"
        else:
            status = "stopped"
        cr.stress = {
            "status": status,
            "max_turns": max_turns,
            "failed_at_turn": failure.get("turn"),
            "failure_kind": failure.get("kind"),
            "reason": failure.get("reason"),
            "prompt_tokens_at_failure": failure.get("prompt_tokens"),
            "tokens_at_failure": failure.get("tokens"),
            # generate never feeds back its last token: the cache needed one row less than the tokens
            "cache_rows_needed": (failure["tokens"] - 1) if failure.get("tokens") else None,
            "turns_completed": len(ok),
            "tokens_completed": (last["prompt_tokens"] + last["new_tokens"]) if last else 0,
            "max_cache_len": cr.max_cache_len,
            "max_position_embeddings": mpe,
            "run": run.to_dict(),
        }
        tick.run_finished()
        if failure:
            # The turns never run still count as done for the progress bar.
            tick(f"{cr.name}: failed at turn {failure['turn']} ({failure['kind']})", max_turns - len(run.turns))
