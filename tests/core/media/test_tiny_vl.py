"""tiny-gemma3-vl: built offline with a working processor, images that change its features, printable replies."""

import numpy as np
import pytest
import torch

from kvinspect.core.errors import ScriptError
from kvinspect.core.media.images import decode_png, encode_png, pixel_hash, read_image
from tests.conftest import load_vl
from tests.helpers import RESOURCES

IMAGES = RESOURCES / "images"


def test_png_round_trip_and_bad_files(tmp_path):
    px = (np.arange(7 * 5 * 3).reshape(7, 5, 3) * 5 % 256).astype(np.uint8)
    assert (decode_png(encode_png(px)) == px).all()
    assert read_image(IMAGES / "checker.png").shape == (24, 32, 3)
    bad = tmp_path / "bad.png"
    bad.write_bytes(b"not a picture")
    with pytest.raises(ScriptError, match="cannot read"):
        read_image(bad)
    with pytest.raises(ScriptError, match="cannot read"):
        read_image(tmp_path / "missing.png")


def test_png_filters_decode_like_the_unfiltered_image():
    import struct
    import zlib

    px = (np.random.RandomState(3).rand(6, 4, 3) * 255).astype(np.uint8)
    ref = decode_png(encode_png(px))
    # Sub filter on every row: each byte stored as the difference to the byte one pixel left.
    rows = []
    for y in range(px.shape[0]):
        line = px[y].reshape(-1).astype(np.int32)
        diff = (line - np.concatenate([np.zeros(3, np.int32), line[:-3]])) & 0xFF
        rows.append(b"\x01" + diff.astype(np.uint8).tobytes())
    plain = encode_png(px)
    start = plain.index(b"IDAT") - 4
    (n,) = struct.unpack(">I", plain[start:start + 4])
    body = zlib.compress(b"".join(rows))
    chunk = struct.pack(">I", len(body)) + b"IDAT" + body + struct.pack(">I", zlib.crc32(b"IDAT" + body))
    assert (decode_png(plain[:start] + chunk + plain[start + 12 + n:]) == ref).all()


def _inputs(lm, image):
    proc = lm.processor
    msgs = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "what is it?"}]}]
    text = proc.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    return proc(text=text, images=[image], return_tensors="pt")


def test_processor_expands_one_image_into_its_span():
    lm = load_vl()
    tok = lm.tokenizer
    out = _inputs(lm, read_image(IMAGES / "gradient.png"))
    ids = out["input_ids"][0].tolist()
    boi, eoi, img = tok.boi_token_id, tok.eoi_token_id, tok.image_token_id
    start = ids.index(boi)
    assert ids[start + 1:start + 17] == [img] * 16 and ids[start + 17] == eoi
    assert out["token_type_ids"][0].tolist()[start + 1:start + 17] == [1] * 16
    assert out["token_type_ids"][0].sum() == 16
    assert tuple(out["pixel_values"].shape) == (1, 3, 28, 28)


def test_different_pictures_give_different_features_and_hashes():
    lm = load_vl()
    a = _inputs(lm, read_image(IMAGES / "gradient.png"))["pixel_values"]
    b = _inputs(lm, read_image(IMAGES / "checker.png"))["pixel_values"]
    assert pixel_hash(a) != pixel_hash(b) and pixel_hash(a) == pixel_hash(a.clone())
    with torch.inference_mode():
        fa = lm.model.model.get_image_features(pixel_values=a)
        fb = lm.model.model.get_image_features(pixel_values=b)
    fa = getattr(fa, "pooler_output", fa)
    fb = getattr(fb, "pooler_output", fb)
    # A zero-filled projection would make every image's features the same.
    assert (fa - fb).abs().max() > 1e-2


def test_reply_to_an_image_is_printable():
    lm = load_vl()
    out = _inputs(lm, read_image(IMAGES / "dusk.png"))
    with torch.inference_mode():
        seq = lm.model.generate(**out, max_new_tokens=12, do_sample=False)
    reply = lm.tokenizer.decode(seq[0, out["input_ids"].shape[1]:])
    assert len(reply) == 12 and reply.isprintable()
