"""How many package files FedACT's local step runs, traced (scripts/trace_step.py): the common
step of a round in the native form is the door, the prepared step, the rule's bias correction
and the band's bookkeeping, in at most 5 files; a step that sends the native form back through
the general path every time (or a new hop on the way) fails here."""

from __future__ import annotations

import importlib.util
from collections import Counter
from pathlib import Path

import pytest

from adaptfl.local_update import native

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "trace_step.py"
COMMON = {"local_update/shell.py", "local_update/step/local_step.py", "local_update/step/native.py",
          "local_update/rules/adam.py", "local_update/band.py"}


def _trace_round():  # noqa: ANN202
    spec = importlib.util.spec_from_file_location("trace_step", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.trace_round


def test_fedacts_common_step_runs_in_five_files() -> None:
    lib = native.library()
    if lib is None or lib.adam is None:
        pytest.skip("no native form of FedACT's step here (no C compiler, or no form of torch's "
                    "AdamW kernel matched): its steps take the fused form's passes")
    traces, opt = _trace_round()(steps=50, diagnostics_every=10)
    by_files = Counter(files for files, _ in traces)
    common, count = by_files.most_common(1)[0]
    assert set(common) == COMMON and len(COMMON) <= 5
    # 5 diagnostics steps (the general path: their scores formed before the loops) and a few
    # band misses; the rest are the prepared step
    assert count >= 30, by_files
    assert opt.paths == {"native": 100}  # both rounds, the diagnostics steps too
