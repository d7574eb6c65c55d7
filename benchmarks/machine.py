"""What a benchmark ran on, printed beside its ratios: the CPU by name, the vector extensions
it has and the one torch's kernels use, the thread count, the load; or the GPU.

    from machine import describe  # benchmarks/ is on sys.path when a benchmark runs
"""

from __future__ import annotations

import os
import platform
from pathlib import Path

import torch

# the extensions that decide how fast torch's CPU kernels are (lscpu's flag names)
VECTOR_FLAGS = ("avx2", "fma", "avx512f", "avx512bw", "avx512_bf16", "avx512_fp16", "amx_bf16",
                "amx_tile", "asimd", "sve")


def cpu_name() -> str:
    """The CPU's model name (/proc/cpuinfo on Linux, platform elsewhere)."""
    info = Path("/proc/cpuinfo")
    if info.is_file():
        for line in info.read_text(errors="replace").splitlines():
            if line.lower().startswith(("model name", "cpu model", "hardware")):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def cpu_flags() -> list[str]:
    """The vector extensions of `VECTOR_FLAGS` that the CPU reports (Linux; [] elsewhere)."""
    info = Path("/proc/cpuinfo")
    if not info.is_file():
        return []
    for line in info.read_text(errors="replace").splitlines():
        if line.lower().startswith(("flags", "features")):
            have = set(line.split(":", 1)[1].split())
            return [f for f in VECTOR_FLAGS if f in have]
    return []


def load() -> str:
    """The 1-minute load average over the CPU count (other processes compete for the cores)."""
    try:
        return f"load {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs"
    except OSError:  # not on every platform
        return f"{os.cpu_count()} CPUs, load unknown"


def describe(device: str) -> str:
    """One line: torch, the device, and for a CPU its name, extensions, threads and load."""
    if torch.device(device).type == "cuda":
        return f"torch {torch.__version__}, {torch.cuda.get_device_name(device)} (CUDA {torch.version.cuda})"
    return (f"torch {torch.__version__}, CPU {cpu_name()} [{' '.join(cpu_flags()) or 'flags unknown'}; "
            f"torch kernels: {torch.backends.cpu.get_cpu_capability()}], "
            f"{torch.get_num_threads()} thread(s), {load()}")
