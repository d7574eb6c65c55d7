"""Fixed point's L2 reach under dp (docs/secagg.md, "Distributed DP"): an input built from the
public rounding seeds, every coordinate just past a rounding threshold, stays within the
sensitivity the nodes' noise is calibrated to, at 16, 20 and 32 bits; the rounding term is √d of
the whole record, not of its largest array."""

from __future__ import annotations

import math

import pytest
import torch
from flwr.app import ConfigRecord

from adaptfl.secagg import client as secagg_client
from adaptfl.secagg import fixedpoint
from adaptfl.secagg import protocol as p

ARRAYS, SIZE = 64, 16  # one record of 64 small arrays: d = 1024, its largest array 16
NODES, NODE = 3, 2


def _slots(clip: float) -> list[fixedpoint.Slot]:
    return [fixedpoint.Slot("delta", f"w{i:02d}", (SIZE,), torch.float32, clip) for i in range(ARRAYS)]


def _worst_input(slots: list[fixedpoint.Slot], bound: int, cfg: ConfigRecord) -> dict[str, torch.Tensor]:
    """x with ‖x‖ ≤ c whose scaled values s = x·B/c sit just past the threshold K − U_i of every
    coordinate, U the node's public rounding draws: each rounds up to K, gaining U_i."""
    generator = secagg_client._rounding(cfg, NODE)  # the seeds the server sends: public
    draws = [torch.rand(s.size, generator=generator, dtype=torch.float64) for s in slots]
    u = torch.cat(draws)
    level = math.floor(bound / math.sqrt(u.numel()))
    levels = torch.full_like(u, float(level))
    raised = True
    while raised:  # one step up where it is cheapest, while ‖s‖ stays within B
        room = bound ** 2 * (1 - 1e-9) - float(((levels - u) ** 2).sum())
        step = 2 * levels + 1 - 2 * u  # ‖s‖²'s growth when s_i grows by 1
        order = torch.argsort(step)
        count = int((torch.cumsum(step[order], 0) <= room).sum())
        levels[order[:count]] += 1
        raised = count > 0
    scaled = levels - u + 1e-7
    x = scaled * (slots[0].clip / bound)
    return {s.name: x[i * SIZE:(i + 1) * SIZE] for i, s in enumerate(slots)}


@pytest.mark.parametrize("bits", [16, 20, 32])
def test_the_worst_rounding_input_stays_within_the_booked_sensitivity(bits: int) -> None:
    slots = _slots(clip=0.5)
    bound = fixedpoint.budget(bits, NODES, 1.0, fixedpoint.rounding_width(slots))
    cfg = ConfigRecord({p.SEED: 5, p.ROUND: 3})
    x = _worst_input(slots, bound, cfg)
    norm = float(torch.cat(list(x.values())).norm())
    assert norm <= 0.5 * (1 + 1e-6)  # clipped to c: a reply dp lets through
    q = fixedpoint.encode({"delta": x}, {}, slots, bound,
                          secagg_client._rounding(cfg, NODE))
    reach = float(torch.from_numpy(q).double().norm())
    d = ARRAYS * SIZE
    assert reach > bound + 0.4 * math.sqrt(d)  # the rounding gains about √d/2 here
    assert reach > bound + math.sqrt(SIZE)  # past B + √(largest array): that bound is unsound
    assert reach <= fixedpoint.sensitivity(bound, slots) == pytest.approx(bound + math.sqrt(d))


def test_a_modulus_where_the_rounding_term_matters_is_refused() -> None:
    """A Δ of 122,500 values (√d = 350) at 16 bits leaves B = 312 (the ring's guard bits taken):
    the noise would be calibrated mostly to the rounding, so the round is refused; at 20 and 32
    bits it is not. ViT-Tiny's Δ (5.7M values, √d = 2391) leaves no B at all at 16 bits."""
    record = [fixedpoint.Slot("delta", "w", (350 ** 2,), torch.float32, 1.0)]
    why = fixedpoint.refusal(16, 5, 1.0, record)
    assert "secagg-modulus-bits=16" in why and "rounding" in why and "\n" not in why
    assert fixedpoint.refusal(20, 5, 1.0, record) == fixedpoint.refusal(32, 5, 1.0, record) == ""
    vit = [fixedpoint.Slot("delta", "w", (5_717_416,), torch.float32, 1.0)]
    assert "secagg-modulus-bits=16" in fixedpoint.refusal(16, 5, 1.0, vit)
    assert fixedpoint.refusal(20, 5, 1.0, vit) == fixedpoint.refusal(32, 5, 1.0, vit) == ""
    small = [fixedpoint.Slot("delta", "w", (4,), torch.float32, 1.0)]
    assert "fewer than 256" in fixedpoint.refusal(16, 200, 0.0, small)
