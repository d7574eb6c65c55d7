"""Building adaptfl's wheel from a chosen set of the checkout's files, as a user's `pip install .`
or the project image's build would (shared by the install and the image tests)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def build_wheel(files: list[str], tmp_path: Path) -> Path:
    """The wheel pip builds from a folder holding exactly `files` (paths relative to the
    checkout), offline, with this interpreter's setuptools."""
    source = tmp_path / "source"
    for name in files:
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, source / name)
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                           "--no-index", "-q", "-w", str(tmp_path / "dist"), str(source)],
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    (wheel,) = (tmp_path / "dist").glob("adaptfl-*.whl")
    return wheel


def tracked_files() -> list[str]:
    """What a fresh clone holds."""
    out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    return [name for name in out.decode().split("\0") if name and (ROOT / name).is_file()]
