"""A user's own package outside the project (`task='pkg.mod:load' model='pkg.mod:build'`),
written into a test's tmp dir: the tests of user tasks and models share its dataset class."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

# What every test package's `mod.py` starts with: a dataset of in-memory rows and the
# 4-class "quadrants" task (learnable: the class is two signs of the first three features).
HEADER = '''
import torch
from adaptfl.workloads import Task

class Rows:
    def __init__(self, x, y):
        self.x, self.labels = x, y
    def __len__(self):
        return len(self.labels)
    def batch(self, idx):
        return self.x[idx], self.labels[idx]

def quadrants(rows, train_rows):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(rows, 6, generator=gen)
    y = (x[:, 0] + x[:, 1] > 0).long() + 2 * (x[:, 2] > 0).long()
    return Task(train=Rows(x[:train_rows], y[:train_rows]), test=Rows(x[train_rows:], y[train_rows:]),
                num_outputs=4, input_shape=(6,), name="quadrants")
'''


def write_user_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, package: str, body: str) -> str:
    """`package.mod` = HEADER + `body`, importable for the test's duration; its module name."""
    folder = tmp_path / "site" / package
    folder.mkdir(parents=True)
    (folder / "__init__.py").write_text("")
    (folder / "mod.py").write_text(textwrap.dedent(HEADER) + textwrap.dedent(body))
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    return f"{package}.mod"
