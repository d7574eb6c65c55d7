"""The one-run audit's power, stated (privacy/audit_power.py, docs/privacy.md "The audit's
power"): at its defaults (1,000 canaries, 100 + 100 guesses) it catches a mechanism only well
below half its noise; at the documented settings (dp='central': 20,000 canaries, 200 + 200;
dp='client': 15,000 canary nodes, 150 + 150) it catches half the noise; z = 2, k = 1, one round."""

from __future__ import annotations

from pathlib import Path

import pytest

from adaptfl.harness.privacy_audit import AuditResult, canary_epsilon
from adaptfl.privacy.audit_power import caught, detected_share

Z, DELTA = 2.0, 1e-5
REFERENCE = canary_epsilon(Z, 1, 1, DELTA)


def test_an_honest_mechanism_is_never_caught_and_a_noiseless_one_always() -> None:
    assert caught(1000, 100, 1, Z, 1.0, REFERENCE, DELTA, 0.95) == 0.0
    assert caught(1000, 100, 1, Z, 0.0, REFERENCE, DELTA, 0.95) == 1.0


@pytest.mark.parametrize(("canaries", "guesses", "half"), [
    (1000, 100, False),  # the CLI's defaults
    (20_000, 200, True),  # dp='central''s documented setting
    (15_000, 150, True),  # dp='client''s (canary nodes)
])
@pytest.mark.slow
def test_the_share_of_noise_each_setting_catches(canaries: int, guesses: int, half: bool) -> None:
    share = detected_share(canaries, guesses, 1, Z, REFERENCE, DELTA, 0.95)
    assert 0.0 < share < 1.0
    assert (share >= 0.5) == half, share


def test_the_result_prints_its_power() -> None:
    result = AuditResult(1000, (100, 100), 130, 1, DELTA, 0.95, 0.5, 9.0, 9.0, REFERENCE,
                         "no-amplification", Path("r"), detected_share=0.37)
    line = next(x for x in result.lines() if x.startswith("power:"))
    assert "drawing 0.37 of its noise or less" in line and "does not catch half the noise" in line
