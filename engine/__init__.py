"""Run the same ServerApp and ClientApp code in one process, without Flower's runtime."""

from adaptfl.engine.inprocess import InProcessGrid, run_inprocess

__all__ = ["InProcessGrid", "run_inprocess"]
