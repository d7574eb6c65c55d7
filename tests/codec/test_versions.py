"""Versioned broadcast records by hand (codec/versions.py): a version is a digest of the record's
bytes, the server leaves out only what a node holds at the announced version and keeps only
echoes it announced, and a node takes a left-out record from its kept copy only when that copy
is the announced version (else it refuses, naming why)."""

from __future__ import annotations

import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, RecordDict

from adaptfl.codec.versions import HELD, NotHeld, addressed, digest, echoed, take_held, versions_of
from adaptfl.core import wire

MODEL = {"w": torch.arange(6, dtype=torch.float32).reshape(2, 3), "n": torch.tensor([3], dtype=torch.int64)}
V_BAR = {"w@q": torch.arange(4, dtype=torch.uint8), "w@s": torch.tensor([0.5])}
BOTH = (wire.ARRAYS, wire.V_BAR)  # records that may be sent unchanged later (model-delta, a frozen v̄)


class Store:
    """A client's durable state, in a dict (`durable`: whether a later round finds a save)."""

    def __init__(self, durable: bool = True) -> None:
        self.durable, self.kept = durable, {}

    def load(self, name: str) -> tuple[dict[str, torch.Tensor] | None, int]:
        return (dict(self.kept[name]), 1) if name in self.kept else (None, 0)

    def save(self, name: str, tensors: dict[str, torch.Tensor]) -> None:
        self.kept[name] = {k: t.clone() for k, t in tensors.items()}


def _instruction() -> RecordDict:
    return RecordDict({wire.ARRAYS: ArrayRecord(MODEL), wire.V_BAR: ArrayRecord(V_BAR),
                       wire.RECIPE: ConfigRecord({"round.server-round": 3})})


@pytest.mark.parametrize("change", [
    lambda t: {**t, "w": t["w"].clone().index_put_((torch.tensor([0]),), torch.tensor([9.0]))},  # a value
    lambda t: {**t, "w": t["w"].reshape(3, 2)},  # a shape
    lambda t: {**t, "w": t["w"].double()},  # a dtype
    lambda t: {"v": t["w"], "n": t["n"]},  # a name
])
def test_a_version_is_the_records_bytes(change) -> None:  # noqa: ANN001
    assert digest(MODEL) == digest({k: t.clone() for k, t in reversed(MODEL.items())})  # order: none
    assert 0 <= digest(MODEL) < 2**63 and digest(change(MODEL)) != digest(MODEL)
    assert digest(V_BAR) == digest(dict(ArrayRecord(V_BAR).to_torch_state_dict()))  # as received


def test_the_server_leaves_out_only_what_the_node_holds_at_that_version() -> None:
    content = _instruction()
    versions = versions_of(content, {wire.ARRAYS, wire.V_BAR, wire.RECIPE})
    assert versions == {wire.ARRAYS: digest(MODEL), wire.V_BAR: digest(V_BAR)}  # not the recipe
    whole = addressed(content, versions, {})
    assert set(whole.array_records) == {wire.ARRAYS, wire.V_BAR}
    assert dict(whole.config_records[wire.VERSIONS]) == versions and wire.RECIPE in whole.config_records
    some = addressed(content, versions, {wire.V_BAR: versions[wire.V_BAR], wire.ARRAYS: 1})
    assert set(some.array_records) == {wire.ARRAYS}  # an old model version: the model goes
    assert set(content.array_records) == {wire.ARRAYS, wire.V_BAR}  # the whole one is untouched


def test_only_records_that_may_repeat_are_versioned_and_none_leaves_the_instruction_whole() -> None:
    """A record that changes every round is never left out, so it is not versioned (a node's copy
    of it would cost a digest and a write per message for nothing); with nothing versioned the
    instruction carries no `versions` at all, and the node keeps and echoes nothing."""
    content = _instruction()
    assert versions_of(content, {wire.V_BAR}) == {wire.V_BAR: digest(V_BAR)}
    assert versions_of(content, set()) == {}
    whole = addressed(content, {}, {wire.ARRAYS: digest(MODEL)})
    assert set(whole.array_records) == {wire.ARRAYS, wire.V_BAR} and wire.VERSIONS not in whole.config_records
    assert whole is not content
    store = Store()
    _, held = take_held(whole, store)
    assert held is None and store.kept == {}


def test_the_server_keeps_only_echoes_of_what_it_announced() -> None:
    announced = {wire.ARRAYS: 5, wire.V_BAR: 7}
    echo = ConfigRecord({wire.ARRAYS: 5, wire.V_BAR: 8, wire.SCAFFOLD_C: 1, wire.DELTA_G: True})
    assert echoed(echo, announced) == {wire.ARRAYS: 5}
    assert echoed(None, announced) == {}
    assert echoed(ConfigRecord({wire.V_BAR: "7"}), announced) == {}


def test_a_node_keeps_what_came_and_fills_in_what_it_holds() -> None:
    store = Store()
    first, held = take_held(addressed(_instruction(), versions_of(_instruction(), BOTH), {}), store)
    assert held == versions_of(_instruction(), BOTH) and wire.VERSIONS not in first.config_records
    assert set(store.kept) == {HELD + wire.ARRAYS, HELD + wire.V_BAR}
    later = addressed(_instruction(), versions_of(_instruction(), BOTH), held)
    assert not later.array_records  # all held
    filled, again = take_held(later, store)
    assert again == held and set(filled.array_records) == {wire.ARRAYS, wire.V_BAR}
    for name, tensors in ((wire.ARRAYS, MODEL), (wire.V_BAR, V_BAR)):
        got = filled.array_records[name].to_torch_state_dict()
        assert all(torch.equal(got[k], t) for k, t in tensors.items())


def test_an_instruction_without_versions_is_whole_and_echoes_nothing() -> None:
    content, held = take_held(_instruction(), Store())
    assert held is None and content is not None and set(content.array_records) == {wire.ARRAYS, wire.V_BAR}


def test_a_node_without_durable_state_keeps_nothing_and_says_so() -> None:
    store = Store(durable=False)
    _, held = take_held(addressed(_instruction(), versions_of(_instruction(), BOTH), {}), store)
    assert held == {} and not store.kept


def test_a_node_that_cannot_keep_a_record_trains_and_holds_nothing(caplog) -> None:  # noqa: ANN001
    store = Store()

    def refuse(name: str, tensors: dict[str, torch.Tensor]) -> None:
        raise ValueError("client state folder belongs to another user")

    store.save = refuse  # type: ignore[method-assign]
    content, held = take_held(addressed(_instruction(), versions_of(_instruction(), BOTH), {}), store)
    assert held == {} and set(content.array_records) == {wire.ARRAYS, wire.V_BAR}
    assert "sent whole again" in caplog.text


def _left_out(store: Store) -> str:
    versions = versions_of(_instruction(), BOTH)
    with pytest.raises(NotHeld) as err:
        take_held(addressed(_instruction(), versions, versions), store)
    assert "\n" not in str(err.value) and (wire.ARRAYS in str(err.value) or wire.V_BAR in str(err.value))
    return str(err.value)


def test_a_node_that_lost_its_copy_refuses() -> None:
    assert "holds none" in _left_out(Store())


def test_a_node_whose_copy_is_another_version_refuses() -> None:
    """It claimed (or the server believed) a version it does not hold: its copy is not used."""
    store = Store()
    store.save(HELD + wire.ARRAYS, {**MODEL, "w": MODEL["w"] + 1})
    store.save(HELD + wire.V_BAR, V_BAR)
    why = _left_out(store)
    assert "kept copy" in why and wire.ARRAYS in why and "not used" in why


def test_a_record_that_arrives_as_another_version_is_refused() -> None:
    versions = {**versions_of(_instruction(), BOTH), wire.V_BAR: 1}
    with pytest.raises(NotHeld, match="arrived as another version"):
        take_held(addressed(_instruction(), versions, {}), Store())


@pytest.mark.parametrize("bad", [{"recipe": 1}, {wire.V_BAR: -1}, {wire.V_BAR: "1"}, {wire.V_BAR: True}])
def test_a_malformed_versions_record_is_refused_in_one_line(bad) -> None:  # noqa: ANN001
    content = _instruction()
    content[wire.VERSIONS] = ConfigRecord(bad)
    with pytest.raises(NotHeld, match="server and client disagree"):
        take_held(content, Store())
