"""Flower's heartbeat at the least interval its SuperLink accepts (10 s, not 30 s), for the
processes of a test deployment that kills SuperNodes: a SIGKILLed SuperNode is then taken for
offline after HEARTBEAT_PATIENCE (2) × 10 s instead of × 30 s (flwr/common/constant.py;
`fleet_handlers.py` accepts 10-1,800 s). Python imports this module at start-up when its folder
is on PYTHONPATH (the `site` module); the constant is set the moment Flower's own module loads,
before any module that copies it (`from flwr.common.constant import ...`) does, and nothing
else is imported early."""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from types import ModuleType

MODULE, NAME, SECONDS = "flwr.common.constant", "HEARTBEAT_DEFAULT_INTERVAL", 10


class _SetAfterLoad(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path, target=None):  # noqa: ANN001
        if fullname != MODULE:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return spec
        execute = spec.loader.exec_module

        def exec_module(module: ModuleType) -> None:
            execute(module)
            setattr(module, NAME, SECONDS)

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


sys.meta_path.insert(0, _SetAfterLoad())
