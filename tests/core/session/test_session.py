"""Chat sessions: correct reuse across turns, per-turn metrics, streaming and stopping.

The reference is transformers alone: a baseline that re-renders the whole conversation every
turn and hands it to ``generate()`` with no cache, so each turn re-prefills the full prompt on a
fresh cache that generate builds and throws away ("rebuilds the prompt without a cache"; with
``use_cache=False`` it would give the same tokens, only O(n^2) slower). Correct reuse must give the
same greedy tokens, one for one, while prefilling only the new suffix.
"""

from __future__ import annotations

import pytest
import torch

from kvinspect.core.detect.events import TURN_STOPPED
from kvinspect.core.errors import ScriptError
from kvinspect.core.session.chat import ChatSession
from kvinspect.core.session.options import SessionOptions
from kvinspect.core.session.script import GenerationSettings
from tests.conftest import load_cached

CAPITALS = ("What is the capital of France?", "And of Italy?", "Which of the two is larger?")


def baseline_without_cache(loaded, turns, max_new_tokens, chat_template=None, system=None):
    """Greedy replies from transformers alone: the full prompt every turn, nothing carried over."""
    tok, model = loaded.tokenizer, loaded.model
    eos = model.generation_config.eos_token_id
    eos = set(eos) if isinstance(eos, (list, tuple)) else {eos}
    history = [{"role": "system", "content": system}] if system else []
    out = []
    for text in turns:
        msgs = history + [{"role": "user", "content": text}]
        kw = {"chat_template": chat_template} if chat_template else {}
        rendered = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False, **kw)
        prompt = tok(rendered, add_special_tokens=False)["input_ids"]
        ids = torch.tensor([prompt])
        with torch.inference_mode():
            seq = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                 max_new_tokens=max_new_tokens, temperature=None, top_p=None, top_k=None,
                                 pad_token_id=tok.pad_token_id)
        new = seq[0, len(prompt):].tolist()
        reply = tok.decode([i for i in new if i not in eos], skip_special_tokens=True)
        out.append({"prompt": prompt, "new": new, "reply": reply})
        history = msgs + [{"role": "assistant", "content": reply}]
    return out


def run_session(loaded, turns, max_new_tokens, policy="reuse", **opts):
    options = SessionOptions(policy=policy, settings=GenerationSettings(max_new_tokens=max_new_tokens), **opts)
    session = ChatSession(loaded, options)
    records, cached = [], []
    try:
        for text in turns:
            records.append(session.run_turn(text))
            cached.append(list(session.cached_ids))
    finally:
        session.close()
    return session, records, cached


def assert_same_tokens(turns, cached, base):
    for k, (t, ids, b) in enumerate(zip(turns, cached, base)):
        assert t.status == "ok", t.error
        assert t.prompt_tokens == len(b["prompt"]), k
        assert t.new_tokens == len(b["new"]), (k, t.reply, b["reply"])
        # The cache holds the prompt and every new token but the last: compare those ids one for one.
        assert ids == b["prompt"] + b["new"][:-1], k
        assert t.reply == b["reply"], k


def test_reuse_equals_the_rebuilt_prompt_baseline_token_for_token_on_smollm2(smollm2):
    n = 16
    base = baseline_without_cache(smollm2, CAPITALS, n)
    assert "Paris" in base[0]["reply"], base[0]["reply"]
    session, turns, cached = run_session(smollm2, CAPITALS, n)
    assert_same_tokens(turns, cached, base)
    # ... while each later turn prefilled only what the cache lacked.
    for prev, t in zip(turns, turns[1:]):
        assert t.reused_tokens == prev.prompt_tokens + prev.new_tokens - 1
        assert t.prefill_tokens == t.prompt_tokens - t.reused_tokens < t.prompt_tokens
    assert len({t.cache_id for t in turns}) == 1
    assert session.cache.get_seq_length() == len(cached[-1])


@pytest.mark.parametrize("name", ["tiny-gemma3", "tiny-llama4", "tiny-gemma2"])
def test_reuse_past_the_window_equals_the_baseline(name):
    """Sliding and chunked layers past their window: reuse must still be exact."""
    loaded = load_cached(name)
    turns_text = ("Tell me something about the sea, please.", "More about waves?", "And the tides?")
    base = baseline_without_cache(loaded, turns_text, 24)
    session, turns, cached = run_session(loaded, turns_text, 24)
    assert_same_tokens(turns, cached, base)
    window = min(lay["window"] for lay in turns[-1].layers if lay["window"])
    assert turns[-1].layers[0]["seen"] > window  # the windows were really passed


def test_turn_metrics_are_consistent():
    loaded = load_cached("tiny-llama")
    streamed: list[str] = []
    options = SessionOptions(settings=GenerationSettings(max_new_tokens=12), system="Be brief.")
    with ChatSession(loaded, options) as session:
        t1 = session.run_turn("Hello there!", on_token=streamed.append)
        text1 = "".join(streamed)
        t2 = session.run_turn("Again, please.")
    assert text1 == t1.reply and len(t1.reply) == 12  # the tiny models emit one character per token
    for t in (t1, t2):
        assert t.status == "ok" and t.new_tokens == 12
        assert 0 < t.ttft_s <= t.total_s
        assert t.tokens_per_s == pytest.approx((t.new_tokens - 1) / (t.total_s - t.ttft_s), rel=1e-6)
        assert t.end_step - t.first_step == t.new_tokens
        assert t.peak_rss > 0 and t.kv_bytes > 0 and t.kv_held_bytes >= t.kv_bytes
        assert t.kv_bytes_by_device == {"cpu": t.kv_bytes}
        assert t.cache_class == "DynamicCache"
    # The system prompt is rendered into the first prompt (character tokenizer: one token per character).
    tok = loaded.tokenizer
    rendered = tok.apply_chat_template([{"role": "system", "content": "Be brief."},
                                        {"role": "user", "content": "Hello there!"}],
                                       add_generation_prompt=True, tokenize=False)
    assert rendered.startswith("<|im_start|>system\nBe brief.")
    assert t1.prompt_tokens == len(tok(rendered, add_special_tokens=False)["input_ids"])
    assert t2.reused_tokens == t1.prompt_tokens + t1.new_tokens - 1
    assert t2.prefill_tokens == t2.prompt_tokens - t2.reused_tokens
    assert t2.first_step == t1.end_step


def test_stop_keeps_a_consistent_cache_and_the_next_turn_reuses_it():
    loaded = load_cached("tiny-mistral")
    got: list[str] = []
    options = SessionOptions(settings=GenerationSettings(max_new_tokens=30))
    with ChatSession(loaded, options) as session:
        t1 = session.run_turn("Stop me early, please.", on_token=got.append, should_stop=lambda: len(got) >= 3)
        held = session.cache.get_seq_length()
        cached = len(session.cached_ids)
        t2 = session.run_turn("Go on.")
    assert t1.status == "stopped" and 3 <= t1.new_tokens < 30
    assert held == cached == t1.prompt_tokens + t1.new_tokens - 1
    stopped = [e for e in session.record.events if e.kind == TURN_STOPPED]
    assert len(stopped) == 1 and stopped[0].severity == "info" and stopped[0].turn == 0
    assert t2.status == "ok" and t2.reused_tokens == cached and t2.cache_id == t1.cache_id
    assert not [e for e in session.record.events if e.is_problem]


def test_user_mistakes_in_a_session_are_one_line_errors():
    loaded = load_cached("tiny-llama")
    with pytest.raises(ScriptError, match="unknown policy"):
        ChatSession(loaded, SessionOptions(policy="reuse-please"))
    with pytest.raises(ScriptError, match="unknown cache implementation"):
        ChatSession(loaded, SessionOptions(cache_impl="paged"))
    with pytest.raises(ScriptError, match="no field"):
        ChatSession(loaded, SessionOptions(generation_config={"not_a_field": 1}))
    with ChatSession(loaded, SessionOptions(settings=GenerationSettings(max_new_tokens=2))) as session:
        with pytest.raises(ScriptError, match="non-empty"):
            session.run_turn("   ")
        assert session.run_turn("fine").status == "ok"
    with pytest.raises(ScriptError, match="chat template"):
        with ChatSession(loaded, SessionOptions(chat_template="{% for m in messages %}{{ m.nope() }}{% endfor %}")) as s:
            s.run_turn("hi")


def test_a_new_chat_starts_a_new_cache_and_the_record_keeps_both():
    loaded = load_cached("tiny-llama")
    with ChatSession(loaded, SessionOptions(settings=GenerationSettings(max_new_tokens=4))) as session:
        a = session.run_turn("first chat")
        session.reset()
        b = session.run_turn("second chat")
    assert b.reused_tokens == 0 and b.prefill_tokens == b.prompt_tokens
    assert b.cache_id != a.cache_id
    assert len(session.record.turns) == 2 and session.record.n_steps == 8
