"""Image turns through kvinspect's own loop: spans in the trace, rows held per layer, exact reuse."""

import pytest
import torch

from kvinspect.core.errors import ScriptError
from kvinspect.core.session.chat import ChatSession
from kvinspect.core.session.options import SessionOptions
from kvinspect.core.session.script import GenerationSettings, parse_script
from tests.conftest import load_cached, load_vl
from tests.helpers import RESOURCES

IMAGES = RESOURCES / "images"


def _session(policy="reuse", new_tokens=24, **kw):
    o = SessionOptions(policy=policy)
    o.settings = GenerationSettings(max_new_tokens=new_tokens)
    return ChatSession(load_vl(), o, **kw)


def _two_turns(s):
    t1 = s.run_turn("what is in this picture?", images=[IMAGES / "gradient.png"])
    t2 = s.run_turn("and this one?", images=[IMAGES / "checker.png"])
    return t1, t2


def test_each_image_is_a_span_with_its_hash_and_the_rows_each_layer_holds():
    s = _session()
    t1, t2 = _two_turns(s)
    assert [e.kind for e in s.record.events if e.is_problem] == []
    assert t2.reused_tokens > t1.prompt_tokens  # the first image's rows were reused, not encoded again
    assert t1.vision_calls == 1 and t2.vision_calls == 1
    a, b = t2.media
    assert (a["image"], a["turn"], a["tokens"], a["encoded"]) == (0, 0, 16, False)
    assert (b["image"], b["turn"], b["tokens"], b["encoded"]) == (1, 1, 16, True)
    assert a["hash"] == t1.media[0]["hash"] != b["hash"]
    assert a["wrap_first"] == a["first"] - 1 and a["wrap_last"] == a["last"] + 1
    assert a["size"] == [32, 24]
    # Three sliding layers (window 80) have let the first image go; the global layer holds all 16 rows.
    assert t1.media[0]["held"] == [16, 16, 16, 16]
    assert a["held"] == [0, 0, 0, 16] and b["held"] == [16, 16, 16, 16]


def test_the_rows_the_view_says_a_layer_holds_are_that_layers_real_k_rows():
    """Each layer's stored K rows, against the same ids run through a cache that keeps every row."""
    from transformers import DynamicCache

    s = _session(new_tokens=6)
    t1 = s.run_turn("what is in this picture?", images=[IMAGES / "gradient.png"])
    s.run_turn("and this one?", images=[IMAGES / "checker.png"])
    cache = s.cache
    ids = s.cached_ids
    lm = load_vl()
    full = DynamicCache()  # no config: every layer keeps every row
    enc = s._enc
    with torch.inference_mode():
        lm.model(input_ids=torch.tensor([ids]), token_type_ids=enc["token_type_ids"][:, :len(ids)],
                 pixel_values=enc["pixel_values"], cache=full, use_cache=True)
    turn = s.record.turns[-1]
    some_evicted = False
    for m in turn.media:
        for layer, held in enumerate(m["held"]):
            keys = cache.layers[layer].keys[0]  # heads × stored rows × dim
            stored, seen = keys.shape[1], len(ids)
            mine = [p for p in range(m["first"], m["last"] + 1) if p >= seen - stored]
            assert len(mine) == held
            some_evicted |= held < m["tokens"]
            for p in mine:
                torch.testing.assert_close(keys[:, p - (seen - stored)], full.layers[layer].keys[0][:, p],
                                           atol=1e-4, rtol=1e-4)
    assert some_evicted and t1.media[0]["held"][-1] == 16


def test_reuse_with_a_new_image_equals_a_fresh_prefill():
    lm = load_vl()
    s = _session(new_tokens=8)
    s.run_turn("what is in this picture?", images=[IMAGES / "gradient.png"])
    seen = []

    def grab(module, args, output):
        seen.append(output[0, -1].detach().clone())

    h = lm.model.lm_head.register_forward_hook(grab)
    try:
        s.run_turn("and this one?", images=[IMAGES / "checker.png"])
    finally:
        h.remove()
    t2 = s.record.turns[-1]
    assert t2.reused_tokens > 0
    reused_first = seen[0]
    enc = s._enc
    with torch.inference_mode():
        fresh = lm.model(**{k: v for k, v in enc.items()}).logits[0, -1]
    delta = float((reused_first - fresh).abs().max())
    assert delta < 1e-3, delta


def test_changed_picture_under_the_same_ids_is_fed_again_from_its_first_token():
    """kvinspect's own reuse compares the pictures too: a swapped picture is re-prefilled, not reused stale."""
    s = _session(new_tokens=6)
    s.run_turn("what is in this picture?", images=[IMAGES / "gradient.png"])
    first = s.record.turns[0].media[0]["first"]
    s.pictures[0] = s.pictures[0][::-1].copy()  # the program's copy of the picture changes
    s.run_turn("and now?")
    t2 = s.record.turns[-1]
    # Cropped to the image's first token, or (sliding layers cannot be cropped back that far) re-prefilled.
    assert t2.reused_tokens in (first, 0)
    assert t2.media[0]["encoded"] and t2.media[0]["hash"] != s.record.turns[0].media[0]["hash"]
    problems = [e for e in s.record.events if e.is_problem]
    div = [e for e in problems if e.kind == "prefix_divergence"]
    assert [(e.data["cause"], e.data["position"]) for e in div] == [("media_changed", first)]
    assert "image 1 changed" in div[0].message
    recreated = [e for e in problems if e.kind == "cache_recreated"]
    assert len(problems) == 1 + len(recreated) and len(recreated) == (t2.reused_tokens == 0)
    assert all(e.data["reusable_tokens"] == first for e in recreated)


def test_script_turns_carry_images_relative_to_the_script(tmp_path):
    sc = parse_script({"turns": [{"text": "look", "images": ["a.png"]}, "plain"]}, "s.json", base=tmp_path)
    assert sc.turns == ["look", "plain"] and sc.images_of(0) == [str(tmp_path / "a.png")] and sc.images_of(1) == []
    assert sc.to_dict()["turns"][0] == {"text": "look", "images": [str(tmp_path / "a.png")]}
    with pytest.raises(ScriptError, match="images"):
        parse_script({"turns": [{"text": "look", "images": "a.png"}]})
    with pytest.raises(ScriptError, match="unknown key"):
        parse_script({"turns": [{"text": "look", "image": ["a.png"]}]})


def test_a_text_model_refuses_an_image_turn():
    s = ChatSession(load_cached("tiny-llama"))
    with pytest.raises(ScriptError, match="takes no images"):
        s.run_turn("look", images=[IMAGES / "gradient.png"])


def test_image_bands_end_where_the_sliding_layers_let_the_image_go():
    from kvinspect.core.media.bands import image_bands

    s = _session()
    _two_turns(s)
    rec = s.record
    bands = {(b.kind, b.image): b for b in image_bands(rec)}
    assert set(bands) == {("full", 0), ("sliding", 0), ("full", 1), ("sliding", 1)}
    first, second = bands[("sliding", 0)], bands[("sliding", 1)]
    assert bands[("full", 0)].x1 == rec.n_steps  # the global layer holds it to the end
    # The sliding layers drop image 1 at turn 2's prefill, once 80 newer positions were seen; image 2 stays.
    assert first.x0 == rec.turns[0].first_step and first.x1 == rec.turns[1].first_step
    seen, stored = rec.col("seen")[:, 0], rec.col("stored")[:, 0]
    assert seen[first.x1] - stored[first.x1] > first.last >= seen[first.x1 - 1] - stored[first.x1 - 1]
    assert second.x0 == rec.turns[1].first_step and second.x1 == rec.n_steps


def test_the_token_view_shows_each_image_as_one_block():
    from kvinspect.core.tokens.states import token_view
    from kvinspect.core.tokens.text import token_text

    s = _session(new_tokens=6)
    _two_turns(s)
    view = token_view(s.record)
    text = token_text(view)
    hashes = [m["hash"][:4] for m in s.record.turns[-1].media]
    assert [f"[image 16 tok #{h}]" in text for h in hashes] == [True, True]
    assert "<image_soft_token>" not in text and text.count("<start_of_image>") == 2


@pytest.mark.parametrize("policy, want", [
    ("reuse", {}),
    ("image-as-text", {"media_fed_as_text": [1, 2]}),
    ("images-again", {"media_reencoded": [2], "turn_failed": [2]}),
    ("image-no-token-types", {"image_causal": [1, 2]}),
])
def test_each_image_policy_shows_its_mistake_and_nothing_else(policy, want):
    s = _session(policy=policy, new_tokens=6)
    _two_turns(s)
    got: dict[str, list[int]] = {}
    for e in s.record.events:
        if e.is_problem:
            got.setdefault(e.kind, []).append(e.turn + 1)
    assert got == want, [e.message for e in s.record.events]
    if policy == "images-again":
        assert "the cache already holds" in s.record.turns[1].error


def test_an_image_policy_needs_a_vision_language_model():
    o = SessionOptions(policy="images-again")
    with pytest.raises(ScriptError, match="vision-language"):
        ChatSession(load_cached("tiny-llama"), o).run_turn("hello")


# -- Qwen2-VL: M-RoPE, spans sized by the picture -----------------------------------------------------------

def _qwen(policy="reuse", new_tokens=6):
    o = SessionOptions(policy=policy)
    o.settings = GenerationSettings(max_new_tokens=new_tokens)
    return ChatSession(load_vl("tiny-qwen2-vl"), o)


def test_qwen_image_spans_follow_the_pictures_size_and_reuse_equals_a_fresh_prefill():
    lm = load_vl("tiny-qwen2-vl")
    s = _qwen()
    s.run_turn("what is in this picture?", images=[IMAGES / "tiles.png"])  # 112²: 16 tokens
    logits = []
    h = lm.model.lm_head.register_forward_hook(lambda m, a, out: logits.append(out[0, -1].detach().clone()))
    try:
        t2 = s.run_turn("and this one?", images=[IMAGES / "gradient.png"])  # 32×24, to the 56² minimum: 6
    finally:
        h.remove()
    assert [m["tokens"] for m in t2.media] == [16, 6] and t2.reused_tokens > t2.media[0]["last"]
    assert [m["encoded"] for m in t2.media] == [False, True] and t2.vision_calls == 1
    assert [e for e in s.record.events if e.is_problem] == []
    lm.model.model.rope_deltas = None  # a fresh prefill computes them again
    with torch.inference_mode():
        fresh = lm.model(**s._enc).logits[0, -1]
    assert float((logits[0] - fresh).abs().max()) < 1e-3


@pytest.mark.parametrize("policy, want", [
    ("image-as-text", {"media_fed_as_text": [1, 2]}),
    ("images-again", {"media_reencoded": [2], "turn_failed": [2]}),
])
def test_qwen_image_policies_show_their_mistake(policy, want):
    s = _qwen(policy)
    s.run_turn("what is in this picture?", images=[IMAGES / "tiles.png"])
    s.run_turn("and this one?", images=[IMAGES / "gradient.png"])
    got: dict[str, list[int]] = {}
    for e in s.record.events:
        if e.is_problem:
            got.setdefault(e.kind, []).append(e.turn + 1)
    assert got == want, [e.message for e in s.record.events]


def test_image_features_encoded_before_observing_and_passed_in_are_not_fed_as_text():
    import contextlib
    import inspect
    import io

    from transformers import DynamicCache

    import kvinspect
    from kvinspect.core.media.images import read_image

    lm = load_vl()
    model, proc = lm.model, lm.processor
    if "mm_encoder_outputs" not in inspect.signature(model.forward).parameters:
        pytest.skip("this transformers takes no pre-encoded image features")
    text = proc.apply_chat_template([{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "hi"}]}],
                                    add_generation_prompt=True, tokenize=False)
    inputs = proc(text=text, images=[read_image(IMAGES / "gradient.png")], return_tensors="pt")
    with torch.no_grad():  # the program's own encoding, before kvinspect looks
        features = model.model.get_image_features(pixel_values=inputs.pop("pixel_values"), return_dict=True)
    with contextlib.redirect_stdout(io.StringIO()), kvinspect.observe(model, proc.tokenizer) as rec:
        model.generate(**inputs, mm_encoder_outputs={"image": features}, cache=DynamicCache(config=model.config),
                       max_new_tokens=4, do_sample=False)
    assert [e.kind for e in rec.events if e.is_problem] == []
    assert rec.turns[0].vision_calls == 0 and len(rec.turns[0].media) == 1
