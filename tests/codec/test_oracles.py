"""Hand-computed encodings of small tensors (values.py, codec.py): the codes, scales and packed
bytes worked out on paper in the comments, then decoded back; and the codec grammar."""

from __future__ import annotations

import pytest
import torch

from adaptfl.codec.codec import Codec
from adaptfl.codec.values import NF4, dequantize, quantize

F32 = torch.float32


def _t(values, dtype=F32) -> torch.Tensor:
    return torch.tensor(values, dtype=dtype)


def test_int8_blockwise_absmax_codes_and_scales() -> None:
    # block 4, 10 values: blocks [0.75, -1, 0.25, 0], [2, 0.2, -0.5, 0], [0, 0] (+2 padding)
    x = _t([0.75, -1.0, 0.25, 0.0, 2.0, 0.2, -0.5, 0.0, 0.0, 0.0])
    parts = quantize(x, "int8", 4)
    # s = absmax per block; the all-zero block gets s = 1
    assert torch.equal(parts["s"], _t([1.0, 2.0, 1.0]))
    # q = round(127·x/s): 95.25→95, -127, 31.75→32, 0 | 127, 12.7→13, -31.75→-32, 0 | 0, 0
    assert torch.equal(parts["q"], _t([95, -127, 32, 0, 127, 13, -32, 0, 0, 0], torch.int8))
    got = dequantize(parts, "int8", 10, 4)
    scale = _t([1.0] * 4 + [2.0] * 4 + [1.0] * 2)
    assert torch.equal(got, _t([95, -127, 32, 0, 127, 13, -32, 0, 0, 0]) / 127 * scale)
    assert got[1] == -1.0 and got[4] == 2.0  # each block's absmax comes back exactly


def test_int8_rounds_half_to_even() -> None:
    # 127·0.5 = 63.5 → 64 (even), 127·(-0.5) → -64; 127·(1.5/3) = 63.5 also
    parts = quantize(_t([1.0, 0.5, -0.5, 0.0]), "int8", 4)
    assert parts["q"].tolist() == [127, 64, -64, 0]


def test_nf4_codes_scales_and_packed_bytes() -> None:
    # block 4: [1, -1, 0, 0.5] (s = 1), [-3, 0.3] (s = 3, t = [-1, 0.1])
    x = _t([1.0, -1.0, 0.0, 0.5, -3.0, 0.3])
    parts = quantize(x, "nf4", 4)
    assert torch.equal(parts["s"], _t([1.0, 3.0]))
    # nearest NF4 level: 1→15, -1→0, 0→7, 0.5→12 (0.4407 vs 0.5626: midpoint 0.5017 > 0.5),
    # -1→0, 0.1→8 (0.0796; the midpoints around it are 0.0398 and 0.1203)
    # pairs, even index in the low nibble: (15,0)→0x0F, (7,12)→0xC7, (0,8)→0x80
    assert parts["q"].dtype == torch.uint8
    assert parts["q"].tolist() == [0x0F, 0xC7, 0x80]
    got = dequantize(parts, "nf4", 6, 4)
    levels = _t(NF4)
    assert torch.equal(got, levels[[15, 0, 7, 12, 0, 8]] * _t([1.0] * 4 + [3.0] * 2))
    assert got.tolist()[:3] == [1.0, -1.0, 0.0] and got[4] == -3.0


def test_fp4_codes_scales_and_packed_bytes() -> None:
    # levels ±{0, .5, 1, 1.5, 2, 3, 4, 6}/6, codes 8-15 the negatives
    # block 4: [6, -3, 1.2, 0] (s = 6, t = [1, -0.5, 0.2, 0]), [-1.2] (s = 1.2, t = -1)
    x = _t([6.0, -3.0, 1.2, 0.0, -1.2])
    parts = quantize(x, "fp4", 4)
    assert torch.equal(parts["s"], _t([6.0, 1.2]))
    # 1 → 7 (6/6), -0.5 → 8+5 = 13 (-3/6), 0.2 → 2 (1/6 = .167 nearer than 1.5/6 = .25),
    # 0 → 0 (+0 before -0), -1 → 15; bytes (7,13)→0xD7, (2,0)→0x02, (15,pad 0)→0x0F
    assert parts["q"].tolist() == [0xD7, 0x02, 0x0F]
    got = dequantize(parts, "fp4", 5, 4)
    assert torch.equal(got, _t([6.0, -3.0, (1.0 / 6.0) * 6.0, 0.0, -1.2]))


def test_bf16_bits_and_fp16() -> None:
    # bf16: 1 = 0x3F80, -2 = 0xC000 (int16 -16384), 0.5 = 0x3F00;
    # 1 + 2^-8 is halfway between 1 and 1 + 2^-7: to even, 1; 1 + 3·2^-9 rounds up to 0x3F81
    x = _t([1.0, -2.0, 0.5, 1.0 + 2**-8, 1.0 + 3 * 2**-9])
    parts = quantize(x, "bf16", 64)
    assert parts["bf16"].dtype == torch.int16
    assert parts["bf16"].tolist() == [0x3F80, -16384, 0x3F00, 0x3F80, 0x3F81]
    assert dequantize(parts, "bf16", 5, 64).tolist() == [1.0, -2.0, 0.5, 1.0, 1.0 + 2**-7]
    # fp16: 1/3 → 0x3555 = 0.333251953125; 2049 → 2048 (to even), 2051 → 2052
    half = quantize(_t([1.0 / 3.0, 2049.0, 2051.0]), "fp16", 64)["fp16"]
    assert half.view(torch.int16).tolist()[0] == 0x3555
    assert dequantize({"fp16": half}, "fp16", 3, 64).tolist() == [0.333251953125, 2048.0, 2052.0]


def test_topk_positions_and_values() -> None:
    # the 3 largest |x| of 6 (top50%): -5 at 1, 3 at 2, 4 at 4; positions increasing, int32
    x = _t([0.1, -5.0, 3.0, 0.0, 4.0, -0.2])
    codec = Codec.parse("top50%")
    parts = codec.encode_array(x, 64)
    assert set(parts) == {"i", "v"}
    assert parts["i"].dtype == torch.int32 and parts["i"].tolist() == [1, 2, 4]
    assert parts["v"].tolist() == [-5.0, 3.0, 4.0]
    assert codec.decode_array(parts, (2, 3), 64).tolist() == [[0.0, -5.0, 3.0], [0.0, 4.0, 0.0]]
    # top50%:int8: the kept values in one block, s = 5: 127·[-1, .6, .8] = -127, 76.2→76, 101.6→102
    q = Codec.parse("top50%:int8").encode_array(x, 64)
    assert set(q) == {"i", "vq", "vs"}
    assert q["vq"].tolist() == [-127, 76, 102] and q["vs"].tolist() == [5.0]


def test_record_names_and_sizes() -> None:
    codec = Codec.parse("top25%:nf4")
    spec = {"w": ((2, 5), F32), "n": ((3,), torch.int64)}
    # 10 values: k = ceil(2.5) = 3; 3 nf4 codes → 2 bytes; one block of 64
    assert codec.record_spec(spec, 64) == {"w@i": ((3,), torch.int32), "w@vq": ((2,), torch.uint8),
                                           "w@vs": ((1,), F32), "n": ((3,), torch.int64)}
    assert Codec.parse("int8").record_spec(spec, 4) == {"w@q": ((10,), torch.int8), "w@s": ((3,), F32),
                                                        "n": ((3,), torch.int64)}
    encoded = codec.encode({"w": torch.arange(10.0).reshape(2, 5), "n": torch.arange(3)}, 64)
    assert torch.equal(encoded["n"], torch.arange(3))  # not float32: passes as it is
    assert encoded["w@i"].tolist() == [7, 8, 9]
    assert Codec.parse("top1%").kept(10) == 1 and Codec.parse("top1%").kept(1000) == 10


@pytest.mark.parametrize("text,canonical", [
    ("fp32", "fp32"), ("int8", "int8"), ("nf4+ef", "nf4+ef"), (" bf16 ", "bf16"),
    ("top1%:fp4+ef", "top1%:fp4+ef"), ("top10%", "top10%"), ("top10%:fp32", "top10%"),
    ("top2.5%:int8", "top2.5%:int8"), ("top10.0%+ef", "top10%+ef")])
def test_valid_codecs_and_their_strings(text, canonical) -> None:
    codec = Codec.parse(text)
    assert str(codec) == canonical
    assert Codec.parse(str(codec)) == codec


def test_parsed_fields() -> None:
    assert Codec.parse("top1%:fp4+ef") == Codec("fp4", 1.0, True)
    assert Codec.parse("fp32").lossless and not Codec.parse("bf16").lossless
    assert not Codec.parse("top10%").lossless  # fp32 values, but most of them dropped


@pytest.mark.parametrize("text", ["int9", "", "INT8", "top0%", "top100%", "top150%", "top10%:top5%",
                                  "int8+ef+ef", "top%", "topk", "int8 +ef", "10%", "top10%:"])
def test_invalid_codecs_are_one_line_errors_naming_the_key(text) -> None:
    with pytest.raises(ValueError) as err:
        Codec.parse(text, "codec-delta")
    message = str(err.value)
    assert "\n" not in message and message.startswith(f"invalid codec-delta={text!r}")


def test_topk_ties_go_to_the_lower_positions() -> None:
    # |x| = [1, 2, 1, 1, 2, 1]: top50% keeps both 2s and the first 1 (position 0)
    x = _t([1.0, -2.0, -1.0, 1.0, 2.0, 1.0])
    assert Codec.parse("top50%").encode_array(x, 64)["i"].tolist() == [0, 1, 4]
    zeros = torch.zeros(9)
    zeros[7] = 3.0
    assert Codec.parse("top30%").encode_array(zeros, 64)["i"].tolist() == [0, 1, 7]


def test_topk_sends_a_nan_as_the_largest_value_and_keeps_k_positions() -> None:
    x = _t([0.5, float("nan"), 2.0, float("inf"), -1.0, 0.0])
    parts = Codec.parse("top50%").encode_array(x, 64)
    assert parts["i"].tolist() == [1, 2, 3]  # NaN, 2, inf: k = 3 all the same
    assert torch.isnan(parts["v"][0]) and parts["v"][1:].tolist() == [2.0, float("inf")]
