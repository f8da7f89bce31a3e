"""The multimodal detectors on hand-made turns: each fires on its pattern with the numbers it names."""

from kvinspect.core.detect.detectors import TurnContext
from kvinspect.core.detect.media import media_events, turn_media
from kvinspect.core.media.spans import ImageTokens, find_spans, held_rows, lone_placeholders
from kvinspect.core.media.watch import FedMedia

TOK = ImageTokens(image=9, start=8, end=7, bidirectional=True)
#              0  1  2  3  4 ...           19 20 21
PROMPT = [1, 2, 8] + [9] * 16 + [7, 3, 4]  # one image: tokens 3–18, BOI at 2, EOI at 19


def _ctx(reused=0, fed=None, before=(), status="ok", prompt=PROMPT):
    ctx = TurnContext(turn_index=1, policy="observed", cache_impl="DynamicCache", cached_before=reused, prompt=prompt,
                      prev_cache_id=None, reused=reused)
    ctx.media_tokens, ctx.media_fed, ctx.media_before, ctx.status = TOK, fed, list(before), status
    ctx.media = turn_media(ctx, 1)
    return ctx


def test_spans_and_rows_held():
    (sp,) = find_spans(PROMPT, TOK)
    assert (sp.first, sp.last, sp.wrap_first, sp.wrap_last, sp.tokens) == (3, 18, 2, 19, 16)
    assert lone_placeholders([1, 8, 2, 8, 9], TOK) == [1]
    assert held_rows(3, 18, seen=40, stored=31) == 10  # keeps positions 9..39
    assert held_rows(3, 18, seen=60, stored=31) == 0
    assert held_rows(3, 18, seen=60, stored=60) == 16


def test_a_correct_image_prefill_is_silent():
    fed = FedMedia(hashes=["aaaa"], vision_calls=1, token_types=[0, 0, 0] + [1] * 16 + [0, 0, 0])
    assert media_events(_ctx(fed=fed)) == []


def test_a_crop_inside_an_image_span_names_the_span():
    before = [{"image": 0, "turn": 0, "first": 3, "last": 18, "hash": "aaaa"}]
    events = media_events(_ctx(reused=10, fed=FedMedia(), before=before))
    crop = [e for e in events if e.kind == "crop_inside_image"]
    assert len(crop) == 1 and crop[0].data == {"position": 10, "image": 0, "span": [3, 18]}
    assert "inside image 1's span (3–18, 16 tokens)" in crop[0].message


def test_a_placeholder_never_expanded_is_media_fed_as_text():
    events = media_events(_ctx(fed=FedMedia(), prompt=[1, 2, 8, 3, 4]))
    assert [(e.kind, e.severity, e.data["position"]) for e in events] == [("media_fed_as_text", "error", 2)]


def test_image_tokens_without_token_types_are_image_causal():
    events = media_events(_ctx(fed=FedMedia(hashes=["aaaa"], vision_calls=1, token_types=None)))
    assert [(e.kind, e.data["position"], e.data["token_type_ids"]) for e in events] == [("image_causal", 3, False)]
    zeros = FedMedia(hashes=["aaaa"], vision_calls=1, token_types=[0] * len(PROMPT))
    assert [e.kind for e in media_events(_ctx(fed=zeros))] == ["image_causal"]


def test_a_cached_picture_encoded_again_or_changed():
    before = [{"image": 0, "turn": 0, "first": 3, "last": 18, "hash": "aaaa"}]
    same = media_events(_ctx(reused=21, fed=FedMedia(hashes=["aaaa"], vision_calls=1), before=before))
    assert [e.kind for e in same] == ["media_reencoded"]
    other = media_events(_ctx(reused=21, fed=FedMedia(hashes=["bbbb"], vision_calls=1), before=before))
    assert [(e.kind, e.data["cause"], e.data["position"]) for e in other] == [("prefix_divergence", "media_changed", 3)]
