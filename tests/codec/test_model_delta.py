"""The model broadcast as a lossless delta (codec/model_delta.py), xor and diff: decoded against
the held model it is the new model bit for bit, any dtype and any bit pattern; a blob of another
size, or not its compressor's, is refused; and a node takes the delta only against the version
the instruction names (codec/versions.py)."""

from __future__ import annotations

import lzma
import zlib

import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, RecordDict

from adaptfl.algorithms.config import RunConfig
from adaptfl.codec import model_delta
from adaptfl.codec.versions import HELD, NotHeld, digest, take_held
from adaptfl.core import wire
from tests.codec.test_versions import Store

OLD = {"w": torch.randn(64, 33, generator=torch.Generator().manual_seed(0)),
       "b": torch.zeros(0), "n": torch.tensor(7, dtype=torch.int64), "h": torch.ones(5, dtype=torch.float64)}
NEW = {"w": OLD["w"] * (1 + 1e-3 * torch.randn(64, 33, generator=torch.Generator().manual_seed(1))),
       "b": torch.zeros(0), "n": torch.tensor(9, dtype=torch.int64), "h": OLD["h"] / 3}


HOWS = sorted(model_delta.BLOBS)


@pytest.mark.parametrize("how", HOWS)
def test_the_delta_decodes_to_the_new_model_bit_for_bit_and_is_smaller(how: str) -> None:
    delta = model_delta.encode(NEW, OLD, how)
    assert set(delta) == {model_delta.BLOBS[how]}
    got = model_delta.decode(delta, OLD)
    assert list(got) == list(OLD)  # the held model's order (not sorted): the reply's Δ keeps it
    for name, t in NEW.items():
        assert got[name].dtype == t.dtype and got[name].shape == t.shape
        assert torch.equal(got[name].reshape(-1).view(torch.uint8), t.reshape(-1).view(torch.uint8)), name
    raw = sum(t.numel() * t.element_size() for t in NEW.values())
    assert delta[model_delta.BLOBS[how]].numel() < raw  # close models: the high bits agree
    assert torch.equal(model_delta.decode(model_delta.encode(OLD, OLD, how), OLD)["w"], OLD["w"])


SPECIAL = torch.tensor([0.0, -0.0, float("inf"), -float("inf"), float("nan"), 1e-45, -1e-45, 3.4e38, -3.4e38])


@pytest.mark.parametrize("how", HOWS)
def test_any_bit_pattern_comes_back_exactly(how: str) -> None:
    """Signed zeros, infinities, NaN, subnormals, the extremes (the ordered difference wraps
    around 2^32), and random bit patterns, float32 and int32 alike."""
    g = torch.Generator().manual_seed(2)

    def bits() -> torch.Tensor:
        return torch.randint(-2**31, 2**31, (1001,), generator=g).to(torch.int32).view(torch.float32)

    extremes = torch.tensor([-2**31, 2**31 - 1, 0, -1], dtype=torch.int32)
    old = {"s": SPECIAL, "r": bits(), "i": extremes}
    new = {"s": SPECIAL.flip(0), "r": bits(), "i": extremes.flip(0)}
    got = model_delta.decode(model_delta.encode(new, old, how), old)
    for name, t in new.items():
        assert torch.equal(got[name].view(torch.int32), t.view(torch.int32)), name


def test_diff_takes_fewer_bytes_than_xor_for_close_float32_models() -> None:
    """Values a little apart: the ordered difference is small where XOR's carries are not."""
    assert model_delta.encode(NEW, OLD, "diff")[model_delta.DIFF_BLOB].numel() < \
        model_delta.encode(NEW, OLD, "xor")[model_delta.BLOB].numel()


def test_a_model_delta_outside_the_choices_is_one_line() -> None:
    with pytest.raises(ValueError, match=r"model-delta.*'zstd'") as err:
        RunConfig.of(model_delta="zstd")
    assert "\n" not in str(err.value)


DIFF_SIZE = 32 * ((64 * 33 + 7) // 8) + 8 + 40  # w as 32 bit planes; n and h as in xor


@pytest.mark.parametrize("key,blob", [
    (model_delta.BLOB, zlib.compress(b"\0" * 10)),  # another size
    (model_delta.BLOB, zlib.compress(b"\0" * (64 * 33 * 4 + 8 + 40 + 1))),  # one byte too many
    (model_delta.BLOB, b"not zlib at all"),
    (model_delta.DIFF_BLOB, lzma.compress(b"\0" * (DIFF_SIZE - 1))),  # one byte short
    (model_delta.DIFF_BLOB, lzma.compress(b"\0" * (DIFF_SIZE + 1))),
    (model_delta.DIFF_BLOB, zlib.compress(b"\0" * DIFF_SIZE)),  # not LZMA
    ("lz4", zlib.compress(b"\0" * 10)),  # no such transform
])
def test_a_blob_that_is_not_a_delta_of_the_held_model_is_refused(key: str, blob: bytes) -> None:
    with pytest.raises(ValueError, match="model delta"):
        model_delta.decode({key: torch.frombuffer(bytearray(blob), dtype=torch.uint8)}, OLD)


def test_the_right_size_of_zeros_is_the_held_model_itself() -> None:
    """The sizes above are the decoder's: the zero delta of that size decodes (to OLD)."""
    got = model_delta.decode({model_delta.DIFF_BLOB: torch.frombuffer(
        bytearray(lzma.compress(b"\0" * DIFF_SIZE)), dtype=torch.uint8)}, OLD)
    assert all(torch.equal(got[n].reshape(-1).view(torch.uint8), t.reshape(-1).view(torch.uint8))
               for n, t in OLD.items())


def _instruction(base: int, delta: dict[str, torch.Tensor]) -> RecordDict:
    return RecordDict({wire.ARRAYS_DELTA: ArrayRecord(delta), wire.RECIPE: ConfigRecord({}),
                       wire.VERSIONS: ConfigRecord({wire.ARRAYS: digest(NEW), wire.ARRAYS_DELTA: base})})


def test_a_node_decodes_the_delta_against_the_named_version_and_keeps_the_new_model() -> None:
    store = Store()
    store.save(HELD + wire.ARRAYS, OLD)
    content, held = take_held(_instruction(digest(OLD), model_delta.encode(NEW, OLD)), store)
    assert held == {wire.ARRAYS: digest(NEW)} and set(content.array_records) == {wire.ARRAYS}
    assert digest(dict(content.array_records[wire.ARRAYS].to_torch_state_dict())) == digest(NEW)
    assert digest(store.kept[HELD + wire.ARRAYS]) == digest(NEW)


@pytest.mark.parametrize("kept,message", [
    (None, "holds none"),  # lost its state
    ({**OLD, "n": torch.tensor(8)}, "kept copy"),  # another model than the delta's base
])
def test_a_node_without_the_deltas_base_refuses(kept, message: str) -> None:  # noqa: ANN001
    store = Store()
    if kept is not None:
        store.save(HELD + wire.ARRAYS, kept)
    with pytest.raises(NotHeld, match=message):
        take_held(_instruction(digest(OLD), model_delta.encode(NEW, OLD)), store)


def test_a_delta_that_decodes_to_another_model_is_not_used() -> None:
    store = Store()
    store.save(HELD + wire.ARRAYS, OLD)
    wrong = {**NEW, "n": torch.tensor(10, dtype=torch.int64)}
    with pytest.raises(NotHeld, match="decoded from its delta"):
        take_held(_instruction(digest(OLD), model_delta.encode(wrong, OLD)), store)
