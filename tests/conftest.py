"""Shared fixtures: small run configs and hand-built Flower messages."""

from __future__ import annotations

import os

import pytest
import torch

os.environ.setdefault("FLWR_DISABLE_UPDATE_CHECK", "1")
os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")

FASHION_MNIST_DIR = "/usr/share/datasets/fashion-mnist"
needs_fashion_mnist = pytest.mark.skipif(
    not os.path.isdir(FASHION_MNIST_DIR),
    reason=f"Fashion-MNIST not installed at {FASHION_MNIST_DIR} (apt-get install dataset-fashion-mnist)",
)


@pytest.fixture
def accelerator_paths(monkeypatch: pytest.MonkeyPatch) -> None:
    """CPU tensors take the branches written for CUDA (local_update/devices.py), so their logic
    runs in CI without a GPU."""
    from adaptfl.local_update import devices

    monkeypatch.setattr(devices, "ACCELERATOR_PATHS_ON_CPU", True)


@pytest.fixture(params=["cpu-paths", "accelerator-paths"])
def either_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The test runs twice: the CPU branches, then the accelerator branches on CPU."""
    from adaptfl.local_update import devices

    monkeypatch.setattr(devices, "ACCELERATOR_PATHS_ON_CPU", request.param == "accelerator-paths")
    return request.param


@pytest.fixture(autouse=True)
def _deterministic_threads():
    torch.set_num_threads(1)  # float results must not depend on the thread count
    yield


@pytest.fixture(autouse=True)
def _own_ledger_dir(tmp_path_factory: pytest.TempPathFactory):
    """Each test's dp runs keep their per-user ledgers (privacy/ledger.py) apart from the user's
    and from other tests' (runs of other δ or accounting on the same data would be refused).
    Set directly, not by monkeypatch: a test's monkeypatch.undo() must not drop it."""
    before = os.environ.get("ADAPTFL_LEDGER_DIR")
    os.environ["ADAPTFL_LEDGER_DIR"] = str(tmp_path_factory.mktemp("ledgers"))
    yield
    if before is None:
        os.environ.pop("ADAPTFL_LEDGER_DIR", None)
    else:
        os.environ["ADAPTFL_LEDGER_DIR"] = before


FORTUNES_DIR = "/usr/share/games/fortunes"
TINY_FASHION_MNIST = (600, 200)  # train, test images
TINY_FORTUNE_BYTES = 12_000  # per language: ~180 windows of 65 bytes, a couple held out


def _write_idx(path, array) -> None:  # noqa: ANN001
    import gzip
    import struct

    import numpy as np

    header = struct.pack(">BBBB", 0, 0, 0x08, array.ndim) + struct.pack(f">{array.ndim}I", *array.shape)
    with gzip.open(path, "wb") as fh:
        fh.write(header + np.ascontiguousarray(array, dtype=np.uint8).tobytes())


@pytest.fixture(scope="session")
def tiny_data(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Small real subsets for end-to-end tests: the first images of Fashion-MNIST, and the first
    bytes of one fortune file per language (Debian's layout). {task: data-dir}."""
    import pathlib

    from adaptfl.workloads.idx import read_idx_file

    if not os.path.isdir(FASHION_MNIST_DIR) or not os.path.isdir(os.path.join(FORTUNES_DIR, "es")):
        pytest.skip("needs dataset-fashion-mnist and fortunes-de/-es/-it (apt-get install ...)")
    root = tmp_path_factory.mktemp("tiny-data")
    fm = root / "fashion-mnist"
    fm.mkdir()
    sizes = {"train": TINY_FASHION_MNIST[0], "t10k": TINY_FASHION_MNIST[1]}
    for split, count in sizes.items():
        for kind in ("images-idx3-ubyte", "labels-idx1-ubyte"):
            name = f"{split}-{kind}"
            full = read_idx_file(pathlib.Path(FASHION_MNIST_DIR) / f"{name}.gz")
            _write_idx(fm / f"{name}.gz", full[:count])
    fo = root / "fortunes"
    for language, topic in (("", "fortunes"), ("de", "zitate"), ("es", "refranes"), ("it", "italia")):
        folder = fo / language
        folder.mkdir(parents=True, exist_ok=True)
        source = pathlib.Path(FORTUNES_DIR) / language / topic
        if not source.is_file():  # any topic file of that language
            source = next(p for p in sorted(source.parent.iterdir())
                          if p.is_file() and not p.is_symlink() and p.suffix not in (".dat", ".u8"))
        text = source.read_bytes()[:TINY_FORTUNE_BYTES]
        (folder / source.name).write_bytes(text[: text.rfind(b"\n%\n") + 1])
    return {"fashion-mnist": str(fm), "fortunes": str(fo)}


def _refuse_constant(name: str) -> float:
    raise ValueError(f"{name} is not JSON")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Every metrics row any test wrote (metrics.jsonl and server-confidential.jsonl under the
    session's temporary folders) parses as strict JSON: no Infinity or NaN (core/json_rows.py).
    A bad line fails the session, naming the file and line."""
    import json
    import pathlib

    factory = getattr(session.config, "_tmp_path_factory", None)
    if factory is None:
        return
    try:
        root = pathlib.Path(factory.getbasetemp())
    except (OSError, ValueError):
        return
    bad: list[str] = []
    for path in [*root.rglob("metrics.jsonl"), *root.rglob("server-confidential.jsonl")]:
        for number, line in enumerate(path.read_text().splitlines(), 1):
            try:
                json.loads(line, parse_constant=_refuse_constant)
            except ValueError as why:
                bad.append(f"{path}:{number}: {why}")
    if bad:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_line("metrics rows that are not JSON:\n  " + "\n  ".join(bad[:20]), red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def _expected_length(item: pytest.Item) -> int:
    """0: starts Flower (the longest), 1: slow, 2: the rest."""
    if item.get_closest_marker("flower"):
        return 0
    return 1 if item.get_closest_marker("slow") else 2


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The longest tests first (a stable sort: each kind keeps its collection order). Under
    `-n 3 --dist loadgroup` each worker takes the next test as it finishes one, so the long
    Flower runs are spread over both workers from the start and the short tests fill in at the
    end, instead of one 2-minute deployment starting last while the other worker idles."""
    items.sort(key=_expected_length)
