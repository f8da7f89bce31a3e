"""kvinspect.observe(model): the user's own code, observed in-process (tiny models and SmolLM2).

The example programs under resources/examples are imported and their ``run(model, tokenizer)``
called inside ``with kvinspect.observe(...)``: each must yield exactly the problem events
resources/examples/expected.json names, in the turns it names, and nothing on the correct ones.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
from pathlib import Path

import pytest
import torch
from transformers import DynamicCache, StoppingCriteria, StoppingCriteriaList

import kvinspect
from kvinspect.core.detect.token_book import UNKNOWN, Fed, TokenBook
from kvinspect.core.observe.api import ObserveError
from kvinspect.core.trace.tracefile import TraceReader, read_trace
from tests.conftest import load_cached, load_vl
from tests.core.examples_expected import load_expected
from tests.helpers import ROOT, wait_for

# The examples pass past_key_values= as the article does; transformers 5.x warns about the spelling.
pytestmark = pytest.mark.filterwarnings("ignore:`past_key_values` is deprecated:FutureWarning")

EXAMPLES_DIR = ROOT / "resources" / "examples"
EXPECTED = load_expected()
EXPECTED_IMAGES = load_expected(images=True)


def load_example(name: str):
    spec = importlib.util.spec_from_file_location(Path(name).stem, EXAMPLES_DIR / name)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def problems_by_turn(events) -> dict[str, list[int]]:
    out: dict[str, set[int]] = {}
    for e in events:
        if e.is_problem:
            out.setdefault(e.kind, set()).add(e.turn + 1)
    return {k: sorted(v) for k, v in out.items()}


def model_class(record) -> str:
    kinds = {lay["config_attention"] != "full" for lay in record.header["layers"]}
    return "sliding" if kinds == {True} else "windowed" if True in kinds else "full"


def expected(name: str, cls: str) -> dict[str, list[int]]:
    """What expected.json asks of ``name`` on a model of class ``cls`` ('sliding' falls back to 'windowed')."""
    want = EXPECTED[name] if name in EXPECTED else EXPECTED_IMAGES[name]
    return want.get(cls, want["windowed"] if cls == "sliding" else want[cls])


def run_observed(lm, name: str, **kw):
    mod = load_example(name)
    with contextlib.redirect_stdout(io.StringIO()):
        with kvinspect.observe(lm.model, lm.tokenizer) as rec:
            mod.run(lm.model, lm.tokenizer, **kw)
    return rec


def chat_ids(lm, text="What is a KV cache?"):
    enc = lm.tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                           return_tensors="pt", return_dict=True)
    return enc["input_ids"]


# -- the article's examples -------------------------------------------------------------------------

@pytest.mark.parametrize("spec", ["tiny-mistral", "tiny-gemma3"])
@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_example_yields_exactly_its_events(spec, name):
    lm = load_cached(spec)
    rec = run_observed(lm, name)
    assert rec.errors == []
    assert model_class(rec.record) in ("windowed", "sliding")
    want = expected(name, model_class(rec.record))
    assert problems_by_turn(rec.events) == want, [e.message for e in rec.events]
    # A turn fails only where the example's mistake makes transformers raise (a full static cache).
    assert [t.index + 1 for t in rec.turns if t.status != "ok"] == want.get("turn_failed", [])
    assert causes(rec.events) == expected_causes(name)
    assert origins(rec.events) == expected_origins(name, rec.events)


@pytest.mark.parametrize("name", sorted(EXPECTED_IMAGES))
def test_image_example_yields_exactly_its_events(name):
    """The vision-language examples, ``run(model, processor)``, on tiny-gemma3-vl."""
    lm = load_vl(EXPECTED_IMAGES[name].get("model", "tiny-gemma3-vl"))
    mod = load_example(name)
    with contextlib.redirect_stdout(io.StringIO()):
        with kvinspect.observe(lm.model, lm.tokenizer) as rec:
            mod.run(lm.model, lm.processor)
    assert rec.errors == []
    want = expected(name, model_class(rec.record))
    assert problems_by_turn(rec.events) == want, [e.message for e in rec.events]
    assert [t.index + 1 for t in rec.turns if t.status != "ok"] == want.get("turn_failed", [])
    want_cause = EXPECTED_IMAGES[name].get("cause")
    assert causes(rec.events) == ({(want_cause, None)} if want_cause else set())
    assert origins(rec.events) == ({"user_code"} if any(e.is_problem for e in rec.events) else set())


def test_stale_picture_is_placed_at_the_images_first_token_and_named():
    lm = load_vl()
    with contextlib.redirect_stdout(io.StringIO()):
        with kvinspect.observe(lm.model, lm.tokenizer) as rec:
            load_example("mistake_swapped_image.py").run(lm.model, lm.processor)
    first = rec.turns[0].media[0]["first"]
    (div,) = [e for e in rec.events if e.kind == "prefix_divergence"]
    assert div.data["position"] == first == div.data["span"][0]
    assert div.data["cached_hash"] == rec.turns[0].media[0]["hash"] != div.data["given_hash"]
    assert "image 1 changed" in div.message and f"position {first}" in div.message
    # The failed call says why in one line.
    assert "a changed picture under ids the cache holds" in rec.turns[1].error


def test_observed_image_loop_has_the_spans_of_kvinspects_own_run(tmp_path):
    """The user's loop that calls the processor itself and `kvinspect run` of the same chat: same images, rows, events."""
    from kvinspect.core.session.runner import run_script
    from kvinspect.core.session.script import load_script

    lm = load_vl()
    with contextlib.redirect_stdout(io.StringIO()):
        with kvinspect.observe(lm.model, lm.tokenizer) as rec:
            load_example("correct_image_chat.py").run(lm.model, lm.processor, max_new_tokens=12)
    script = load_script(ROOT / "resources" / "scripts" / "images.json")
    script.settings.max_new_tokens = 12
    ran = run_script(lm, script, tmp_path / "run").record
    keys = ("image", "turn", "first", "last", "tokens", "wrap_first", "wrap_last", "hash", "held")
    assert [[{k: m[k] for k in keys} for m in t.media] for t in rec.turns] == \
        [[{k: m[k] for k in keys} for m in t.media] for t in ran.turns]
    assert [t.vision_calls for t in rec.turns] == [t.vision_calls for t in ran.turns] == [1, 1]
    assert [e for e in rec.events if e.is_problem] == [] == [e for e in ran.events if e.is_problem]


def origins(events) -> set[str]:
    return {e.data.get("origin") for e in events if e.is_problem}


def expected_origins(name: str, events) -> set[str]:
    """Every problem event says where its pattern comes from: the example's 'origin', else the user's code."""
    return {EXPECTED[name].get("origin", "user_code")} if any(e.is_problem for e in events) else set()


def causes(events) -> set[tuple[str, str | None]]:
    return {(e.data.get("cause"), e.data.get("detail")) for e in events if e.kind == "prefix_divergence"}


def expected_causes(name: str) -> set[tuple[str, str | None]]:
    want = EXPECTED[name]
    return {(want["cause"], want.get("detail"))} if "cause" in want else set()


@pytest.mark.smollm2
@pytest.mark.timeout(900)  # every example on the real model, 4 new tokens a turn
def test_examples_on_smollm2(smollm2):
    got, want = {}, {}
    for name in sorted(EXPECTED):
        rec = run_observed(smollm2, name, max_new_tokens=4)
        assert rec.errors == [], name
        got[name] = problems_by_turn(rec.events), causes(rec.events), origins(rec.events)
        want[name] = expected(name, model_class(rec.record)), expected_causes(name), expected_origins(name, rec.events)
    assert got == want


def test_divergence_message_names_position_and_text():
    lm = load_cached("tiny-llama")
    rec = run_observed(lm, "mistake_think_template_no_prefix_check.py")
    ev = next(e for e in rec.events if e.kind == "prefix_divergence")
    # The think block the template drops from history is what the cache holds at that position.
    assert "<think>" in ev.message and ev.data["position"] < ev.data["cached"]
    assert rec.turns[1].divergence_at == ev.data["position"]


def test_reencoded_history_reports_position_and_count():
    lm = load_cached("tiny-llama")
    rec = run_observed(lm, "mistake_reencode_history.py")
    ev = next(e for e in rec.events if e.kind == "duplicate_context")
    turn1 = rec.turns[0]
    # Turn 2 re-fed everything the cache held after turn 1, appended after it.
    assert ev.turn == 1 and ev.data["position"] == ev.data["count"]
    assert ev.data["count"] >= turn1.prompt_tokens


# -- results unchanged, hooks gone ------------------------------------------------------------------

def _generate(lm, observed: bool, do_sample: bool, seed: int = 0, n: int = 12):
    ids = chat_ids(lm)
    cache = DynamicCache(config=lm.model.config)
    torch.manual_seed(seed)
    ctx = kvinspect.observe(lm.model, lm.tokenizer) if observed else contextlib.nullcontext()
    with ctx:
        out = lm.model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), past_key_values=cache,
                                do_sample=do_sample, max_new_tokens=n, top_k=None if not do_sample else 50)
    return out


@pytest.mark.parametrize("do_sample", [False, True], ids=["greedy", "seeded-sampling"])
def test_observed_run_is_bit_identical(do_sample):
    lm = load_cached("tiny-gemma3")
    a = _generate(lm, False, do_sample)
    b = _generate(lm, True, do_sample)
    assert torch.equal(a, b)
    ids = chat_ids(lm)
    plain = lm.model(input_ids=ids).logits
    with kvinspect.observe(lm.model):
        seen = lm.model(input_ids=ids).logits
    assert torch.equal(plain, seen)


@pytest.mark.smollm2
def test_observed_run_is_bit_identical_on_smollm2(smollm2):
    for do_sample in (False, True):
        assert torch.equal(_generate(smollm2, False, do_sample, n=6), _generate(smollm2, True, do_sample, n=6))


def _hook_state(model):
    import torch.nn.modules.module as M

    glob = {n: dict(getattr(M, n)) for n in dir(M) if n.startswith("_global_") and n.endswith("hooks")}
    local = [(m._forward_hooks.copy(), m._forward_pre_hooks.copy(), dict(m._forward_hooks_with_kwargs),
              dict(m._forward_pre_hooks_with_kwargs)) for m in model.modules()]
    return glob, local


def test_hooks_are_gone_after_the_block_even_after_an_error():
    from kvinspect.core.model.loading import load_model

    lm = load_model("tiny-llama", device="cpu")  # a fresh model: nothing else has touched its hooks
    before = _hook_state(lm.model)
    assert not lm.model._forward_hooks and not lm.model._forward_pre_hooks
    with kvinspect.observe(lm.model, lm.tokenizer) as rec:
        assert lm.model._forward_pre_hooks and lm.model._forward_hooks
        lm.model.generate(input_ids=chat_ids(lm), max_new_tokens=3, do_sample=False)
    assert _hook_state(lm.model) == before
    assert not lm.model._forward_hooks and not lm.model._forward_pre_hooks
    assert not lm.model._forward_hooks_with_kwargs and not lm.model._forward_pre_hooks_with_kwargs
    with pytest.raises(ZeroDivisionError):
        with kvinspect.observe(lm.model):
            1 / 0
    assert _hook_state(lm.model) == before
    assert len(rec.turns) == 1 and rec.turns[0].new_tokens == 3


def test_observe_refuses_what_it_cannot_observe():
    with pytest.raises(ObserveError, match="needs a transformers model"):
        kvinspect.observe(object())
    assert "\n" not in str(ObserveError("a\nb"))


# -- turns --------------------------------------------------------------------------------------------

def test_each_generate_call_is_a_turn_and_manual_loops_follow_the_rules():
    lm = load_cached("tiny-llama")
    model = lm.model
    ids = chat_ids(lm)
    with torch.inference_mode(), kvinspect.observe(lm) as rec:
        model.generate(input_ids=ids, max_new_tokens=4, do_sample=False)
        model.generate(input_ids=ids, max_new_tokens=2, do_sample=False)
        assert [t.status for t in rec.turns] == ["ok", "ok"]  # closed as soon as generate() returned
        cache = DynamicCache(config=model.config)
        out = model(input_ids=ids, past_key_values=cache)  # manual turn A: prefill + 2 decode steps
        for _ in range(2):
            out = model(input_ids=out.logits[:, -1:].argmax(-1), past_key_values=cache)
        more = lm.tokenizer("\nand more", return_tensors="pt")["input_ids"]
        out = model(input_ids=more, past_key_values=cache)  # a prefill after decode steps: turn B
        model(input_ids=out.logits[:, -1:].argmax(-1), past_key_values=cache)
        model(input_ids=ids, past_key_values=DynamicCache(config=model.config))  # a new cache object: turn C
        rec.mark("scoring")
        model(input_ids=ids)  # marked: these stay one turn whatever they look like
        model(input_ids=more)
    forwards = [t.end_step - t.first_step for t in rec.turns]
    assert forwards == [4, 2, 3, 2, 1, 2]
    assert rec.turns[0].user.startswith("generate() at test_observe.py:")
    assert rec.turns[2].user.startswith("model() at test_observe.py:")
    assert rec.turns[-1].user == "scoring"
    assert rec.turns[0].new_tokens == 4 and rec.turns[0].prompt_tokens == ids.shape[1]
    assert rec.turns[3].reused_tokens == ids.shape[1] + 2  # turn B continued the cache of turn A
    assert rec.problems == []


def test_manual_loop_that_never_passes_its_cache_is_flagged():
    """Each forward lets the model build (and drop) a cache, then re-encodes the whole sequence."""
    lm = load_cached("tiny-llama")
    seq = chat_ids(lm)
    with torch.inference_mode(), kvinspect.observe(lm) as rec:
        for _ in range(4):
            out = lm.model(input_ids=seq)
            seq = torch.cat([seq, out.logits[:, -1:].argmax(-1)], dim=1)
    assert len(rec.turns) == 1 and rec.problems == ["cache_recreated"]


def test_new_conversations_with_fresh_caches_are_not_recreation():
    lm = load_cached("tiny-llama")
    with kvinspect.observe(lm) as rec:
        for text in ("What is a KV cache?", "Name a sliding-window model."):
            ids = chat_ids(lm, text)
            lm.model.generate(input_ids=ids, attention_mask=torch.ones_like(ids),
                              past_key_values=DynamicCache(config=lm.model.config), max_new_tokens=4)
    assert rec.problems == []


def test_chat_loop_without_any_cache_argument_is_recreation():
    """generate() builds a new cache every call: a chatbot that passes none re-prefills its history."""
    lm = load_cached("tiny-llama")
    messages = []
    with kvinspect.observe(lm) as rec:
        for text in ("What is a KV cache?", "Shorter."):
            messages.append({"role": "user", "content": text})
            ids = lm.tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt",
                                                   return_dict=True)["input_ids"]
            out = lm.model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=5)
            messages.append({"role": "assistant",
                             "content": lm.tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True)})
    assert problems_by_turn(rec.events) == {"cache_recreated": [2]}


def test_prefix_check_and_crop_by_the_user_is_quiet():
    """The think template diverges, but a loop that crops to the common prefix does it right."""
    lm = load_cached("tiny-llama")
    template = (ROOT / "resources" / "templates" / "qwen3-think.jinja").read_text()
    messages, cache, cached = [], DynamicCache(config=lm.model.config), []
    with kvinspect.observe(lm) as rec:
        for text in ("What is a KV cache?", "Shorter.", "Thanks."):
            messages.append({"role": "user", "content": text})
            ids = lm.tokenizer.apply_chat_template(messages, chat_template=template, add_generation_prompt=True,
                                                   return_tensors="pt", return_dict=True)["input_ids"]
            prompt = ids[0].tolist()
            p = 0
            while p < min(len(cached), len(prompt) - 1) and cached[p] == prompt[p]:
                p += 1
            if p < cache.get_seq_length():
                cache.crop(p - cache.get_seq_length())
            out = lm.model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), past_key_values=cache,
                                    max_new_tokens=5)
            cached = prompt + out[0, ids.shape[1]:-1].tolist()
            messages.append({"role": "assistant",
                             "content": lm.tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True)})
    assert rec.problems == []
    assert rec.turns[1].cropped_from is not None and rec.turns[1].reused_tokens < rec.turns[1].cropped_from


# -- the trace file grows while the code runs -----------------------------------------------------------

class _Peek(StoppingCriteria):
    """Reads the trace from inside generate(), as a follower in another process would."""

    def __init__(self, path, fail_at=None):
        self.path, self.fail_at, self.seen = path, fail_at, []

    def __call__(self, input_ids, scores, **kwargs):
        r = TraceReader(self.path)
        r.poll()
        self.seen.append((r.record.n_steps, r.record.turns[-1].status))
        if self.fail_at is not None and len(self.seen) >= self.fail_at:
            raise RuntimeError("user code failed mid-generate")
        return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)


def test_trace_grows_live_while_the_code_runs(tmp_path):
    lm = load_cached("tiny-gemma3")
    ids = chat_ids(lm)
    peek = _Peek(tmp_path / "trace.jsonl")
    follower = None
    with kvinspect.observe(lm.model, lm.tokenizer, trace=tmp_path, flush_every_s=0) as rec:
        lm.model.generate(input_ids=ids, max_new_tokens=5, stopping_criteria=StoppingCriteriaList([peek]))
        # Inside generate() the follower saw the turn running, one more step each time.
        assert [n for n, _ in peek.seen] == [1, 2, 3, 4, 5] and {s for _, s in peek.seen} == {"running"}
        follower = TraceReader(tmp_path)
        follower.poll()
        # generate() returned and the program idles: the live ticker closes the turn on its own.
        assert wait_for(lambda: follower.poll() or follower.record.turns[0].status == "ok")
        assert follower.record.turns[0].status == "ok" and not follower.ended
        lm.model.generate(input_ids=ids, max_new_tokens=3)
    assert follower.poll() and follower.ended
    assert [t.status for t in follower.record.turns] == ["ok", "ok"] and follower.record.n_steps == 8
    assert (tmp_path / "summary.json").is_file()
    assert json.loads((tmp_path / "summary.json").read_text())["steps"] == 8
    assert rec.trace_path == tmp_path / "trace.jsonl"


def test_a_failure_inside_generate_keeps_a_readable_trace(tmp_path):
    lm = load_cached("tiny-llama")
    ids = chat_ids(lm)
    with pytest.raises(RuntimeError, match="mid-generate"):
        with kvinspect.observe(lm.model, lm.tokenizer, trace=tmp_path) as rec:
            lm.model.generate(input_ids=ids, max_new_tokens=4)
            lm.model.generate(input_ids=ids, max_new_tokens=8,
                              stopping_criteria=StoppingCriteriaList([_Peek(tmp_path / "trace.jsonl", fail_at=3)]))
    back = read_trace(tmp_path)
    assert [t.status for t in back.turns] == ["ok", "failed"]
    assert "RuntimeError" in back.turns[1].error
    assert back.turns[1].end_step - back.turns[1].first_step == 3  # the forwards made before the failure
    assert "turn_failed" in {e.kind for e in back.events} and rec.errors == []


# -- the token book on its own ----------------------------------------------------------------------------

def test_token_book_rules():
    book = TokenBook()
    opening = list(range(100, 140))  # a 40-token first prompt
    r = book.analyse([Fed(0, 1, 40, True, 0, opening), Fed(1, 1, 1, True, 40, [7]), Fed(2, 1, 1, True, 41, [8])],
                     None, None)
    assert r.duplicates == [] and r.new_ids == [7, 8, UNKNOWN]
    # A new message that starts like the conversation did (a template header) is not a re-feed...
    r = book.analyse([Fed(3, 1, 6, True, 42, opening[:6] + [9, 9])], None, None)
    assert r.duplicates == []
    # ...re-feeding the whole opening prompt is.
    r = book.analyse([Fed(4, 1, 50, True, 50, opening + [7, 8] + [5] * 8)], None, None)
    assert r.duplicates == [(4, 1, 50, 42)]
    # A forward that starts shorter than the book: the user cropped; generate() ids that differ: divergence.
    book2 = TokenBook()
    book2.analyse([Fed(0, 2, 5, True, 0, [1, 2, 3, 4, 5])], None, None)
    r = book2.analyse([Fed(1, 2, 2, True, 3, [6, 7])], [1, 2, 3, 6, 7], None)
    assert (r.cropped_from, r.cropped_to, r.reused, r.divergence) == (5, 3, 3, None)
    r = book2.analyse([Fed(2, 2, 1, True, 5, [8])], [1, 9, 3, 6, 7, 8], None)
    assert r.divergence == (2, 2, 1)
    # Tokens the cache held before observation began are unknown and match anything.
    book3 = TokenBook()
    r = book3.analyse([Fed(0, 3, 2, True, 4, [5, 6])], [1, 2, 3, 4, 5, 6], None)
    assert r.divergence is None and book3.held[3] == [UNKNOWN] * 4 + [5, 6]


def test_a_turn_given_embeddings_is_not_checked_against_ids():
    # transformers' own test_generate_continue_from_inputs_embeds: a legitimate continuation by embeddings.
    lm = load_cached("tiny-llama")
    m, tok = lm.model, lm.tokenizer
    ids = tok("hello there friend", return_tensors="pt")["input_ids"]
    with contextlib.redirect_stdout(io.StringIO()), kvinspect.observe(m, tok) as rec:
        out = m.generate(inputs_embeds=m.get_input_embeddings()(ids), max_new_tokens=3, do_sample=False,
                         return_dict_in_generate=True)
        full = torch.cat([ids, out.sequences], dim=1)
        m.generate(inputs_embeds=m.get_input_embeddings()(full), past_key_values=out.past_key_values,
                   max_new_tokens=3, do_sample=False, return_dict_in_generate=True)
    assert len(rec.turns) == 2 and [e.kind for e in rec.events if e.is_problem] == []
    for t in rec.turns:
        length = next(c for c in t.checklist if c["key"] == "length")
        assert length["evidence"].startswith("not checkable: the call gave embeddings")
        assert t.divergence_at is None
    obj = next(c for c in rec.turns[1].checklist if c["key"] == "cache_object")
    assert obj["status"] == "pass" and "same object as last turn" in obj["evidence"]
