"""FedACT's AdamW direction, trust pass and step as C loops on the CPU (native_source.py), compiled
once per machine.

torch's fused AdamW kernel and eager torch after it need about 29 passes over the D entries
(the ρ·Δ_G copy, the kernel, the scores, the band's compares and counts, φ, the decay and the
step) and cannot fuse them. The loops do the same work in two passes and one call (step/native.py's `act`):
its first pass (as `Library.adam_band`) does the kernel's arithmetic, forms s = u ⊙ g and counts
the band selection's entries without storing s; `pick` selects the k-th largest among them; `step` writes
x = (1 - δ)·x + φ ⊙ u with φ from the threshold compare. `band` is the first pass without the
AdamW part (where the kernel ran already).

Built from `native_source.SOURCE` (a Python string, so that a Flower App Bundle carries it: the
FAB keeps only .py, .toml, .md, .yaml, .yml, .json and .jsonl files) with the C compiler found
(`$CC`, else cc, gcc or clang; about a second) on first use, kept under `$ADAPTFL_NATIVE_CACHE`
(default ~/.cache/adaptfl/native), keyed by a hash of the source, the compiler and the CPU. Before
first use, `library()` runs the loops on small problems against what they replace and keeps them
only if the results are bit for bit the same: the band and step against the eager passes (the step
as fused multiply-add or as product then sum, whichever matches torch's `addcmul_`), the AdamW
part against `torch._fused_adamw_` (the form, of those torch's compiler may have built, that
matches; none: the kernel runs, then `band`). Without a compiler, or if the check fails, or with
`ADAPTFL_NATIVE=0`, `library()` is None and the eager passes run: the same numbers, slower (one
warning line per process, except under `ADAPTFL_NATIVE=0`). Whether a step runs here is decided
by `step/choose.py` alone; the optimizer counts the forms its steps took (`LocalUpdate.paths`).
"""

from __future__ import annotations

import ctypes
import hashlib
import itertools
import logging
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import torch

from adaptfl.local_update.devices import cpu_path
from adaptfl.local_update.native_source import SOURCE
from adaptfl.local_update.rules.adam import kernel_coefficients

ENABLED = os.environ.get("ADAPTFL_NATIVE", "1") != "0"  # the tests switch it per test
_GRAIN = 1 << 15  # entries per thread at least: below this a thread costs more than it does
_FLAGS: tuple[list[str], ...] = (  # first that builds
    ["-march=native", "-fopenmp"], ["-fopenmp"], ["-march=native"], [])
_log = logging.getLogger(__name__)
_P, _I64, _F, _INT = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float, ctypes.c_int


class Library:
    """The loaded loops and whether the step fuses its multiply-add (as torch's addcmul_ here)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.dll = ctypes.CDLL(str(path))
        self.dll.adaptfl_band.argtypes = [_P, _P, _P, _P, _I64, _I64, _F, _F, _P, _P, _I64, _P, _INT]
        self.dll.adaptfl_band.restype = None
        self.dll.adaptfl_step.argtypes = [_P, _P, _P, _P, _I64, _I64, _F, _I64, _F, _INT, _F, _F, _INT, _INT,
                                          _INT]
        self.dll.adaptfl_step.restype = None
        self.dll.adaptfl_adam_band.argtypes = [_P, _P, _P, _P, _P, _P, _I64, _I64, _P, _INT, _INT, _F,
                                               _F, _P, _P, _I64, _P, _INT]
        self.dll.adaptfl_adam_band.restype = None
        self.dll.adaptfl_pick.argtypes = [_I64, _I64, _P, _P, _I64, _P, _INT, _F, _F, _P, _P, _P]
        self.dll.adaptfl_pick.restype = _INT
        self.dll.adaptfl_act.argtypes = [_P, _P, _P, _P, _P, _P, _P, _I64, _I64, _P, _INT, _INT, _F, _F,
                                         _P, _P, _I64, _P, _INT, _P, _P, _I64, _F, _INT, _F, _F, _INT]
        self.dll.adaptfl_act.restype = _INT
        self.fused = 1
        self.adam: tuple[int, int] | None = None  # (vector length, kind) of torch's AdamW kernel here

    def band(self, u: torch.Tensor, a: torch.Tensor | None, g: Segments, lo: float,
             hi: float, idx: torch.Tensor, val: torch.Tensor, counts: torch.Tensor, nt: int) -> None:
        self.dll.adaptfl_band(u.data_ptr(), None if a is None else a.data_ptr(), *g.args(),
                              u.numel(), lo, hi, idx.data_ptr(), val.data_ptr(),
                              idx.numel() // nt, counts.data_ptr(), nt)

    def adam_band(self, u: torch.Tensor, a: torch.Tensor, m: torch.Tensor, v: torch.Tensor,
                  g: Segments, coef: torch.Tensor, lo: float, hi: float, idx: torch.Tensor,
                  val: torch.Tensor, counts: torch.Tensor, nt: int,
                  adam: tuple[int, int] | None = None) -> None:
        form = adam or self.adam
        if form is None:
            raise RuntimeError("adam_band needs a form of torch's AdamW kernel (none matched here)")
        vec, kind = form
        self.dll.adaptfl_adam_band(u.data_ptr(), a.data_ptr(), m.data_ptr(), v.data_ptr(), *g.args(),
                                   u.numel(), coef.data_ptr(), vec, kind, lo, hi, idx.data_ptr(),
                                   val.data_ptr(), idx.numel() // nt, counts.data_ptr(), nt)

    def step(self, x: torch.Tensor, u: torch.Tensor, g: Segments, t: float, cut: int,
             decay: float | None, ca: float, cg: float, scored: bool, nt: int) -> None:
        self.dll.adaptfl_step(x.data_ptr(), u.data_ptr(), *g.args(), x.numel(), t, cut,
                              1.0 if decay is None else decay, decay is not None, ca, cg,
                              self.fused, int(scored), nt)


class Segments:
    """g as the loops read it: consecutive tensors (the parameters' own gradients, where the
    step leaves them, or one flat vector), by their addresses and offsets."""

    def __init__(self, tensors: list[torch.Tensor], offsets: torch.Tensor,
                 pointers: torch.Tensor | None = None) -> None:
        self.tensors = tensors  # held: the addresses stay valid while the loops run
        self.pointers = torch.tensor([t.data_ptr() for t in tensors], dtype=torch.int64) \
            if pointers is None else pointers  # int64: the tensors' addresses
        self.offsets = offsets  # int64 [len(tensors) + 1]: 0, then the running sizes

    @classmethod
    def flat(cls, g: torch.Tensor) -> Segments:
        return cls([g], torch.tensor([0, g.numel()], dtype=torch.int64))

    def args(self) -> tuple[int, int, int]:
        return self.pointers.data_ptr(), self.offsets.data_ptr(), len(self.tensors)


_loaded: Library | None = None
_tried = False
def library() -> Library | None:
    """The checked loops, built or loaded on first call; None where they cannot be used."""
    global _loaded, _tried
    if not ENABLED:
        return None
    if not _tried:
        _tried = True
        try:
            path = _build()
            _loaded = None if path is None else _checked(Library(path))
        except (OSError, subprocess.SubprocessError) as exc:
            _log.warning("native FedACT loops unavailable (%s); the eager passes run", exc)
            _loaded = None
    return _loaded


def usable(*tensors: torch.Tensor) -> bool:
    """Whether the loops can run on these tensors: contiguous float32 on the CPU's branch."""
    return library() is not None and all(
        t.dtype == torch.float32 and t.is_contiguous() and cpu_path(t) for t in tensors)


def adam_usable() -> bool:
    """Whether `act` can do the AdamW kernel's work: the loops are usable and one of their forms of torch's
    fused AdamW kernel matched it here bit for bit."""
    lib = library()
    return lib is not None and lib.adam is not None


def pick(k: int, n: int, lo: float, hi: float, idx: torch.Tensor, val: torch.Tensor,
         counts: torch.Tensor, nt: int, work: torch.Tensor, ipos: torch.Tensor
         ) -> tuple[float, int, int] | None:
    """After `band` (or `Library.adam_band`) over [lo, hi] (same idx, val, counts, nt): (t, cut, m) with t
    the k-th largest of the n scores (+0.0 for a zero), cut the position of the first entry
    equal to t that the top k leaves out (n if none) and m the band's entries; None if the
    k-th largest lies outside the band, or more entries fell in a block than it holds (unless
    lo == hi: then they all equal t, and cut is found if it lies among the positions kept).
    Compacts idx and val in place.
    Scratch: `work` float32 of idx's length + 1, `ipos` int64 of 2."""
    lib = _required()
    if lib.dll.adaptfl_pick(k, n, idx.data_ptr(), val.data_ptr(), idx.numel() // nt,
                            counts.data_ptr(), nt, lo, hi, work.data_ptr(),
                            work.data_ptr() + 4 * (work.numel() - 1), ipos.data_ptr()) != 1:
        return None  # a miss, or (2) the first dropped tie lies beyond the positions kept
    m, cut = ipos.numpy().tolist()  # numpy, not torch: no dispatcher call (costly when cold)
    return float(work.numpy()[-1]), cut, m


def threads(n: int) -> int:
    return max(1, min(torch.get_num_threads(), n // _GRAIN))


def band(u: torch.Tensor, a: torch.Tensor | None, g: Segments, lo: float, hi: float,
         idx: torch.Tensor, val: torch.Tensor, counts: torch.Tensor, nt: int) -> None:
    """u += a (if given); counts[2i], counts[2i+1] = #(s > hi), #(lo <= s <= hi) in the i-th of
    nt equal ranges of s = u ⊙ g, whose first idx.numel() // nt band positions and scores fill
    the i-th block of idx and val."""
    _required().band(u, a, g, lo, hi, idx, val, counts, nt)


def step(x: torch.Tensor, u: torch.Tensor, g: Segments, t: float, cut: int,
         decay: float | None, ca: float, cg: float, scored: bool = False) -> None:
    """x = x·decay (if given), then x + f ⊙ u with f = ca where s > t or s == t at a position
    below `cut`, cg elsewhere; s = u ⊙ g, or g itself if `scored`."""
    _required().step(x, u, g, t, cut, decay, ca, cg, scored, threads(x.numel()))


def _required() -> Library:
    lib = library()
    if lib is None:
        raise RuntimeError("the native loops are not available here (check native.usable first)")
    return lib


# --- building and checking ---------------------------------------------------------------

def _compiler() -> str | None:
    return os.environ.get("CC") or next(
        (found for name in ("cc", "gcc", "clang") if (found := shutil.which(name))), None)


def _cache_dir() -> Path:
    if os.environ.get("ADAPTFL_NATIVE_CACHE"):
        return Path(os.environ["ADAPTFL_NATIVE_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "adaptfl" / "native"


def _cpu() -> str:
    """What -march=native builds for: the CPU's model and flags (Linux), else the platform."""
    info = Path("/proc/cpuinfo")
    lines = info.read_text(errors="replace").splitlines() if info.is_file() else []
    wanted = [ln for ln in lines if ln.lower().startswith(("model name", "flags", "features"))][:2]
    return "\n".join(wanted) or platform.platform()


def _build(flags: tuple[tuple[str, ...], ...] | None = None) -> Path | None:
    """The cached library, compiled into the cache if absent; None without a compiler. `flags`:
    the extra compiler flags to try in turn (default `_FLAGS`: for this CPU, with OpenMP; the
    tests build other instruction sets with e.g. ("-march=native", "-mno-avx512f"))."""
    cc = _compiler()
    if cc is None:
        _log.warning("no C compiler found (set CC, or install cc, gcc or clang): FedACT's trust "
                     "step runs its eager passes, the same numbers, slower")
        return None
    source = SOURCE.encode()
    tries = tuple(map(tuple, _FLAGS)) if flags is None else flags
    key = hashlib.sha256(b"\0".join([source, cc.encode(), _cpu().encode(), platform.machine().encode(),
                                     *([] if flags is None else [repr(flags).encode()])])).hexdigest()[:20]
    target = _cache_dir() / f"adaptfl_native_{key}.so"
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    for extra in tries:
        with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
            out, src = Path(tmp) / target.name, Path(tmp) / "adaptfl_native.c"
            src.write_bytes(source)
            cmd = [cc, "-O3", "-std=gnu11", "-ffp-contract=off", "-fno-math-errno", "-fPIC",
                   "-shared", *extra, str(src), "-o", str(out), "-lm"]
            if subprocess.run(cmd, capture_output=True, timeout=120).returncode == 0 and _loads(out):
                os.replace(out, target)  # atomic: concurrent processes see a whole file or none
                return target
    _log.warning("%s could not compile native_source.SOURCE: FedACT's trust step runs its eager passes", cc)
    return None


def _loads(path: Path) -> bool:
    """Whether the built library loads: a compiler may accept -fopenmp yet link no OpenMP
    runtime (zig cc, the compose image's compiler: deploy/Dockerfile), leaving its symbols unresolved."""
    try:
        ctypes.CDLL(str(path))
    except OSError:
        return False
    return True


def _split(g: torch.Tensor) -> Segments:
    """g in uneven segments (one empty), as a model's gradients come."""
    sizes = [0, 7, 1000, 0, g.numel() - 1007]
    return Segments(list(torch.split(g, sizes)), torch.tensor([0, *itertools.accumulate(sizes)]))


def _checked(lib: Library) -> Library | None:
    """lib if both loops reproduce the eager passes bit for bit on a small problem with ties
    at the threshold and a tail shorter than a vector, else None."""
    gen = torch.Generator().manual_seed(0)
    n = 3 * _GRAIN + 37  # several threads where there are several
    u, a, x = (torch.randn(n, generator=gen) for _ in range(3))
    g = torch.randn(n, generator=gen)
    for v in (u, a, g):  # ties: every fifth score equal
        v[::5] = v[5]
    uu = u.clone()
    s = torch.add(a, u) * g
    t = float(s[5])
    lo, hi = t - 0.5, t + 0.5
    nt = threads(n)
    idx, val = torch.empty(n * nt, dtype=torch.int64), torch.empty(n * nt)
    counts = torch.empty(2 * nt, dtype=torch.int64)
    lib.band(uu, a, _split(g), lo, hi, idx, val, counts, nt)
    blocks = [slice(i * n, i * n + int(counts[2 * i + 1])) for i in range(nt)]
    inside = ((s >= lo) & (s <= hi)).nonzero().squeeze(1)
    if not (torch.equal(uu, torch.add(a, u)) and int(counts[0::2].sum()) == int((s > hi).sum())
            and torch.equal(torch.cat([idx[b] for b in blocks]), inside)
            and torch.equal(torch.cat([val[b] for b in blocks]), s[inside])):
        _log.warning("native band pass differs from torch's: not used")
        return None
    cut = int((s == t).nonzero()[1])  # the second tie at t and later ones drop
    keep = s >= t
    keep[cut:] &= s[cut:] > t
    ca, cg, dec = -2.5e-3, -4e-4, 1.0 - 1e-4
    expected = x.clone().mul_(dec).addcmul_(uu, torch.where(keep, ca, cg))
    for fused in (1, 0):
        lib.fused = fused
        results = []
        for scored in (False, True):
            got = x.clone()
            lib.step(got, uu, Segments.flat(s) if scored else _split(g), t, cut, dec, ca, cg,
                     scored, nt)
            results.append(torch.equal(got, expected))
        if all(results):
            lib.adam = _adam_form(lib)
            return lib
    _log.warning("native step differs from torch's addcmul_ either way: not used")
    return None


# torch's kernel: vector length (8 or 16 floats) and which products its compiler fused
# (native_source.py, ADAM_LOOP); the forms seen first: AVX2/AVX-512 builds, then plain C
_ADAM_FORMS = list(dict.fromkeys([(8, 43), (16, 43), (8, 0), (16, 0)] + [
    (vec, kind) for vec in (8, 16, 4) for kind in range(64) if (kind >> 1) & 3 < 3 and (kind >> 4) & 3 < 3]))


def _adam_form(lib: Library) -> tuple[int, int] | None:
    """The (vector length, kind) for which `Library.adam_band` reproduces torch._fused_adamw_ bit for
    bit on tensors with tails of several lengths, at two settings; None if none."""
    gen = torch.Generator().manual_seed(1)
    sizes = [0, 7, 1000, 0, 37, 13, 3 * _GRAIN + 5]
    n = sum(sizes)
    g = torch.randn(n, generator=gen)
    m, v = 0.1 * torch.randn(n, generator=gen), 0.01 * torch.rand(n, generator=gen)
    a = torch.randn(n, generator=gen)
    nt = threads(n)
    idx, val = torch.empty(n * nt, dtype=torch.int64), torch.empty(n * nt)
    counts, coef = torch.empty(2 * nt, dtype=torch.int64), torch.empty(6)
    cases = []
    for beta1, beta2, eps, lr, step in ((0.9, 0.999, 1e-8, -0.7, 3.0), (0.6, 0.95, 1e-3, -1e-3, 1.0)):
        u, mm, vv = a.clone(), m.clone(), v.clone()
        lists = [list(torch.split(t, sizes)) for t in (u, g, mm, vv)]
        # mypy cannot match the unpacked *lists to the overloads' positional tensor lists
        torch._fused_adamw_(*lists, [], [torch.tensor(step)] * len(sizes), lr=lr,  # type: ignore[call-overload]
                            beta1=beta1, beta2=beta2, weight_decay=0.0, eps=eps, amsgrad=False,
                            maximize=False)
        cases.append((kernel_coefficients(beta1, beta2, eps, lr, step, coef.clone()), u, mm, vv))
    segments = Segments(list(torch.split(g, sizes)), torch.tensor([0, *itertools.accumulate(sizes)]))
    for form in _ADAM_FORMS:
        if all(_adam_matches(lib, form, a, m, v, segments, c, (idx, val, counts, nt)) for c in cases):
            return form
    _log.warning("no native form of torch's fused AdamW kernel matches it here: FedACT runs the "
                 "kernel, then its native loops")
    return None


def _adam_matches(lib: Library, form: tuple[int, int], a: torch.Tensor, m: torch.Tensor,
                  v: torch.Tensor, g: Segments, case: tuple[Any, ...],
                  scratch: tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]) -> bool:
    coef, u_ref, m_ref, v_ref = case
    u, mm, vv = torch.empty_like(a), m.clone(), v.clone()
    lib.adam_band(u, a, mm, vv, g, coef, 0.0, -1.0, *scratch, adam=form)
    return torch.equal(u, u_ref) and torch.equal(mm, m_ref) and torch.equal(vv, v_ref)
