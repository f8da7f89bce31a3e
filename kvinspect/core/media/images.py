"""Image files read into pixels, and the short hash that names an image by its processed pixels.

Pillow reads every format when it is installed. Without it a PNG (8-bit, not interlaced: what
screenshots, the bundled examples and most tools write) is still read by the small decoder here,
so a built-in multimodal model runs on a machine with neither Pillow nor torchvision.
"""

from __future__ import annotations

import hashlib
import struct
import zlib
from pathlib import Path

import numpy as np

from kvinspect.core.errors import ScriptError

#: Larger than any image a processor keeps at full size; a bigger file is a mistake, not a picture.
MAX_PIXELS = 64_000_000
_PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
_CHANNELS = {0: 1, 2: 3, 4: 2, 6: 4}  # PNG colour type -> samples per pixel (3, palette, handled apart)


def read_image(path: str | Path) -> np.ndarray:
    """``path`` as an ``H×W×3`` uint8 array; ScriptError (one line) when it cannot be read."""
    p = Path(path)
    try:
        data = p.read_bytes()
    except OSError as exc:
        raise ScriptError(f"cannot read image {p}: {exc.strerror or exc}") from None
    try:
        from PIL import Image
    except ImportError:
        return decode_png(data, str(p))
    import io

    try:
        with Image.open(io.BytesIO(data)) as im:
            if im.width * im.height > MAX_PIXELS:
                raise ScriptError(f"image {p} is {im.width}×{im.height}: too large")
            return np.asarray(im.convert("RGB"), dtype=np.uint8).copy()
    except ScriptError:
        raise
    except Exception as exc:  # noqa: BLE001 - Pillow raises many types for a bad file
        raise ScriptError(f"cannot read image {p}: {exc}") from None


def decode_png(data: bytes, where: str = "image") -> np.ndarray:
    """An 8-bit, non-interlaced PNG (grey, grey+alpha, RGB, RGBA, palette) as ``H×W×3`` uint8."""
    if not data.startswith(_PNG_MAGIC):
        raise ScriptError(f"cannot read {where}: not a PNG file (install Pillow for other formats)")
    pos, idat, palette = 8, [], None
    width = height = depth = ctype = interlace = -1
    try:
        while pos < len(data):
            (n,) = struct.unpack(">I", data[pos:pos + 4])
            kind = data[pos + 4:pos + 8]
            body = data[pos + 8:pos + 8 + n]
            pos += 12 + n
            if kind == b"IHDR":
                width, height, depth, ctype, _, _, interlace = struct.unpack(">IIBBBBB", body)
            elif kind == b"PLTE":
                palette = np.frombuffer(body, dtype=np.uint8).reshape(-1, 3)
            elif kind == b"IDAT":
                idat.append(body)
            elif kind == b"IEND":
                break
    except struct.error:
        raise ScriptError(f"cannot read {where}: the PNG file is truncated") from None
    if depth != 8 or interlace != 0 or (ctype not in _CHANNELS and ctype != 3):
        raise ScriptError(f"cannot read {where}: only 8-bit non-interlaced PNGs are read without Pillow")
    if width <= 0 or height <= 0 or width * height > MAX_PIXELS:
        raise ScriptError(f"cannot read {where}: {width}×{height} is not a usable image size")
    ch = 1 if ctype == 3 else _CHANNELS[ctype]
    try:
        raw = zlib.decompress(b"".join(idat))
    except zlib.error:
        raise ScriptError(f"cannot read {where}: the PNG data is damaged") from None
    stride = width * ch
    if len(raw) < height * (stride + 1):
        raise ScriptError(f"cannot read {where}: the PNG data is truncated")
    px = _unfilter(np.frombuffer(raw, dtype=np.uint8)[: height * (stride + 1)].reshape(height, stride + 1), ch)
    px = px.reshape(height, width, ch)
    if ctype == 3:
        if palette is None:
            raise ScriptError(f"cannot read {where}: a palette PNG without its palette")
        return palette[np.minimum(px[..., 0], len(palette) - 1)]
    if ch in (1, 2):
        return np.repeat(px[..., :1], 3, axis=2)
    return np.ascontiguousarray(px[..., :3])


def _unfilter(rows: np.ndarray, bpp: int) -> np.ndarray:
    """PNG's per-row filters undone (None, Sub, Up, Average, Paeth)."""
    h, w = rows.shape[0], rows.shape[1] - 1
    out = np.zeros((h, w), dtype=np.int32)
    prev = np.zeros(w, dtype=np.int32)
    for y in range(h):
        f, line = rows[y, 0], rows[y, 1:].astype(np.int32)
        if f == 0:
            cur = line
        elif f == 2:
            cur = (line + prev) & 0xFF
        elif f in (1, 3, 4):
            cur = line.copy()
            for x in range(w):  # each byte depends on the one bpp before it
                a = cur[x - bpp] if x >= bpp else 0
                if f == 1:
                    pred = a
                elif f == 3:
                    pred = (a + prev[x]) >> 1
                else:
                    b, c = prev[x], prev[x - bpp] if x >= bpp else 0
                    pa, pb, pc = abs(b - c), abs(a - c), abs(a + b - 2 * c)
                    pred = a if pa <= pb and pa <= pc else (b if pb <= pc else c)
                cur[x] = (cur[x] + pred) & 0xFF
        else:
            raise ScriptError(f"cannot read image: unknown PNG filter {int(f)}")
        out[y] = cur
        prev = cur
    return out.astype(np.uint8)


def encode_png(pixels: np.ndarray) -> bytes:
    """``H×W×3`` uint8 as a PNG (no filter): what tests and examples write without Pillow."""
    px = np.ascontiguousarray(pixels, dtype=np.uint8)
    h, w = px.shape[:2]
    raw = b"".join(b"\x00" + px[y].tobytes() for y in range(h))

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body) & 0xFFFFFFFF)

    return (_PNG_MAGIC + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))


def per_image(pixels, grid=None) -> list:
    """The processed pixels of each image: a row of an ``images × C × H × W`` batch, or (Qwen2-VL's flattened
    patches, with ``grid``: each image's t×h×w) that image's patch rows."""
    if pixels is None:
        return []
    if grid is not None and len(pixels.shape) == 2:
        sizes = [int(t) * int(h) * int(w) for t, h, w in grid.tolist()]
        if sum(sizes) != int(pixels.shape[0]):
            return []
        out, at = [], 0
        for n in sizes:
            out.append(pixels[at:at + n])
            at += n
        return out
    if len(pixels.shape) == 4:
        return [pixels[i] for i in range(int(pixels.shape[0]))]
    return []


def pixel_hash(pixels) -> str:
    """Twelve hex digits of SHA-256 over the processed pixels (shape and values): the same picture, the same name."""
    arr = pixels.detach().float().cpu().numpy() if hasattr(pixels, "detach") else np.asarray(pixels, dtype=np.float32)
    h = hashlib.sha256(str(tuple(arr.shape)).encode())
    h.update(np.ascontiguousarray(arr, dtype=np.float32).tobytes())
    return h.hexdigest()[:12]
