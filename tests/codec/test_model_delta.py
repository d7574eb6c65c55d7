"""The model broadcast as a lossless delta (codec/model_delta.py): decoded against the held model
it is the new model bit for bit, any dtype; a blob of another size, or not zlib, is refused; and a
node takes the delta only against the version the instruction names (codec/versions.py)."""

from __future__ import annotations

import zlib

import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, RecordDict

from adaptfl.codec import model_delta
from adaptfl.codec.versions import HELD, NotHeld, digest, take_held
from adaptfl.core import wire
from tests.codec.test_versions import Store

OLD = {"w": torch.randn(64, 33, generator=torch.Generator().manual_seed(0)),
       "b": torch.zeros(0), "n": torch.tensor(7, dtype=torch.int64), "h": torch.ones(5, dtype=torch.float64)}
NEW = {"w": OLD["w"] * (1 + 1e-3 * torch.randn(64, 33, generator=torch.Generator().manual_seed(1))),
       "b": torch.zeros(0), "n": torch.tensor(9, dtype=torch.int64), "h": OLD["h"] / 3}


def test_the_delta_decodes_to_the_new_model_bit_for_bit_and_is_smaller() -> None:
    delta = model_delta.encode(NEW, OLD)
    got = model_delta.decode(delta, OLD)
    assert list(got) == list(OLD)  # the held model's order (not sorted): the reply's Δ keeps it
    for name, t in NEW.items():
        assert got[name].dtype == t.dtype and got[name].shape == t.shape
        assert torch.equal(got[name].reshape(-1).view(torch.uint8), t.reshape(-1).view(torch.uint8)), name
    raw = sum(t.numel() * t.element_size() for t in NEW.values())
    assert delta[model_delta.BLOB].numel() < raw  # close models: the XOR's high bytes are zero
    assert torch.equal(model_delta.decode(model_delta.encode(OLD, OLD), OLD)["w"], OLD["w"])


@pytest.mark.parametrize("blob", [
    zlib.compress(b"\0" * 10),  # another size
    zlib.compress(b"\0" * (64 * 33 * 4 + 8 + 40 + 1)),  # one byte too many
    b"not zlib at all",
])
def test_a_blob_that_is_not_a_delta_of_the_held_model_is_refused(blob: bytes) -> None:
    with pytest.raises(ValueError, match="model delta"):
        model_delta.decode({model_delta.BLOB: torch.frombuffer(bytearray(blob), dtype=torch.uint8)}, OLD)


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
