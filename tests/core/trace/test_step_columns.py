"""One step column decoded from a stream line: the live stream's blocks are one or two steps."""

from __future__ import annotations

import base64
import zlib

import numpy as np
import pytest

from kvinspect.core.trace.messages import MessageError, encode_array
from kvinspect.core.trace.validate import decode_column


@pytest.mark.parametrize("rows", [0, 1, 2, 7])
def test_a_delta_column_of_any_length_decodes_to_its_values(rows):
    seen = (np.arange(rows * 3, dtype=np.int32).reshape(rows, 3) * 17 + 1000).astype(np.int32)
    got = decode_column("seen", encode_array(seen, delta=True), (rows, 3))
    assert got.dtype == np.int32 and got.shape == (rows, 3)
    np.testing.assert_array_equal(got, seen)


def test_a_one_row_delta_column_is_its_row_not_a_difference():
    nbytes = np.array([[1 << 40, 3, 0, 5]], np.int64)
    got = decode_column("nbytes", encode_array(nbytes, delta=True), (1, 4))
    np.testing.assert_array_equal(got, nbytes)


def test_a_big_endian_column_decodes_to_native_values():
    t = np.array([0.5, 1.25, 3.0], np.float64)
    spec = dict(encode_array(t, delta=False), dtype=">f8", data=base64.b64encode(zlib.compress(t.astype(">f8").tobytes())).decode())
    got = decode_column("t", spec, (3,))
    assert got.dtype.isnative
    np.testing.assert_array_equal(got, t)


@pytest.mark.parametrize("dtype", ["no such dtype", "|O", "<i8"])
def test_a_wrong_dtype_is_refused_every_time_it_comes(dtype):
    spec = encode_array(np.zeros(2, np.int32), delta=True)
    spec["dtype"] = dtype
    for _ in range(2):  # the second time too: a refused name is not remembered as good
        with pytest.raises(MessageError, match="column turn: dtype"):
            decode_column("turn", spec, (2,))
