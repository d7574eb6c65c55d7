"""FedACT's native trust pass and step (local_update/native_source.py, step/native.py) against the eager
passes they replace: the same parameters and moments bit for bit, step after step, whether the
band hits, misses to the sample's band or to the radix selection; the loops alone against
torch's compares, counts and `torch.topk`'s set (ties to the lower index) at any thread split;
the AdamW-and-band pass against torch's own fused AdamW kernel; the loops built for other
instruction sets (AVX2, plain C); the build from the Python string alone (no .c file: what a
Flower App Bundle carries); and the eager passes, with one warning line, where no compiler is
found or the loops fail their check."""

from __future__ import annotations

import itertools
import logging
import math
import platform
import sys
from pathlib import Path

import pytest
import torch

from adaptfl.local_update import LocalUpdate, band, native
from adaptfl.local_update.rules.adam import kernel_coefficients
from adaptfl.local_update.step import choose
from adaptfl.local_update.step import native as native_form

N = 40_000  # above topk._SMALL: the band path
_STEP, _ACT = native.step, native_form.act


def _choose(opt: LocalUpdate) -> choose.Path:
    """choose_path as `opt.step` asks it: the first group's rule and parameters with a gradient."""
    group = opt.param_groups[0]
    return choose.choose_path(opt, opt.rule(group), [p for p in group["params"] if p.grad is not None])


@pytest.fixture
def fresh_native(monkeypatch: pytest.MonkeyPatch, tmp_path):  # noqa: ANN001, ANN201
    """native.py as on first use, building into an empty cache."""
    monkeypatch.setattr(native, "_tried", False)
    monkeypatch.setattr(native, "_loaded", None)
    monkeypatch.setenv("ADAPTFL_NATIVE_CACHE", str(tmp_path))
    return tmp_path


def _lib() -> native.Library:
    lib = native.library()
    if lib is None:
        pytest.skip("no C compiler here: the eager passes run (tested below)")
    return lib


def _model(gen: torch.Generator) -> dict[str, torch.nn.Parameter]:
    shapes = {"w0": (150, 200), "b0": (150,), "w1": (60, 150), "b1": (60,), "tail": (37,)}
    return {n: torch.nn.Parameter(torch.randn(s, generator=gen)) for n, s in shapes.items()}


def _run(native_on: bool, monkeypatch: pytest.MonkeyPatch, gamma: float | None, wd: float,
         tau: float) -> tuple[list[torch.Tensor], list[bool]]:
    """Ten FedACT steps: drifting gradients (the band hits), three with 60 % of the gradients
    exactly zero (dead ReLUs: for τ = 0.5 the threshold is a zero tied thousands of times, the
    band [0, 0]), a jump in scale (it misses to the sample's band), one with every score tied
    at zero, one where the sample's band misses too (the radix selection), ties at the
    threshold. Returns the parameters and moments after every step, and which band each
    native step's selection came from."""
    monkeypatch.setattr(native, "ENABLED", native_on)
    calls: list[bool] = []  # per native step: whether it read stored scores (a band missed)
    monkeypatch.setattr(native, "step", lambda *a: calls.append(a[-1]) or _STEP(*a))

    def act(*a):  # noqa: ANN002, ANN202
        calls.extend(["adam"] if a[2] is not None else [])  # the kernel's work in the band pass
        found = _ACT(*a)
        calls.extend([False] if found is not None else [])  # stepped from the unstored scores
        return found

    monkeypatch.setattr(native_form, "act", act)
    gen = torch.Generator().manual_seed(3)
    params = _model(gen)
    opt = LocalUpdate(params.items(), preconditioner="adamw", lr=1e-2, weight_decay=wd, rho=0.5,
                      trust="act", tau=tau, gamma=gamma, parameters_as_bucket_view=True)
    opt.set_global_direction({n: 1e-3 * torch.randn(p.shape, generator=gen) for n, p in params.items()})
    base = {n: torch.randn(p.shape, generator=gen) for n, p in params.items()}
    dead = {n: torch.rand(p.shape, generator=gen) < 0.6 for n, p in params.items()}
    out = []
    for step in range(10):
        for n, p in params.items():
            grad = base[n] + 0.01 * step * torch.randn(p.shape, generator=gen)
            if step in (3, 4, 5):
                grad[dead[n]] = 0.0
            if step == 6:
                grad = grad * 1e3  # the scores' scale jumps: the previous band misses
            if step == 8:
                grad = torch.zeros_like(grad)  # u ⊙ g = 0 everywhere: ties, both bands miss
            grad.view(-1)[::97] = grad.view(-1)[0]  # repeated values: ties among the scores
            p.grad = grad
        real = band._sample_band
        if step == 9:  # far above every score: the radix selection
            monkeypatch.setattr(band, "_sample_band", lambda *a: (1e30, 2e30))
        opt.step()
        monkeypatch.setattr(band, "_sample_band", real)
        out.append(torch.cat([t.detach().reshape(-1) for t in params.values()]))
        out.append(torch.cat([opt.state[p]["exp_avg_sq"].reshape(-1) for p in params.values()]))
    return out, calls


@pytest.mark.parametrize(("gamma", "wd", "tau"), [(None, 0.01, 0.5), (0.0, 0.0, 0.1), (0.3, 0.1, 0.9)])
def test_native_steps_are_the_eager_steps_bit_for_bit(monkeypatch: pytest.MonkeyPatch,
                                                      gamma: float | None, wd: float, tau: float) -> None:
    _lib()
    eager, none = _run(False, monkeypatch, gamma, wd, tau)
    fast, used = _run(True, monkeypatch, gamma, wd, tau)
    # the previous threshold's band, the sample's, and the radix selection (no native step);
    # every step ran torch's AdamW kernel's work in the loops' first pass (the first step, with
    # no band yet, through an empty one)
    steps = [c for c in used if c != "adam"]
    assert none == [] and len(steps) == 9 and steps.count(False) >= 2 and steps.count(True) >= 2
    assert used.count("adam") == 10
    if tau == 0.5:  # the threshold a zero tied ~20,000 times: the band [0, 0] holds it natively
        assert steps[4:6] == [False, False]
    for i, (a, b) in enumerate(zip(eager, fast, strict=True)):
        assert torch.equal(a, b), f"step {i // 2 + 1}, {'x' if i % 2 == 0 else 'v'}"


def _fedact() -> LocalUpdate:
    """FedACT's optimizer over N coordinates with gradients set: the native form's case."""
    gen = torch.Generator().manual_seed(0)
    w = torch.nn.Parameter(torch.randn(N, generator=gen))
    w.grad = torch.randn(N, generator=gen)
    opt = LocalUpdate([("w", w)], preconditioner="adamw", lr=1e-3, rho=0.5, trust="act",
                      parameters_as_bucket_view=True)
    opt.set_global_direction({"w": torch.randn(N, generator=gen)})
    return opt


def _scores(n: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    u, g = torch.randn(n, generator=gen), torch.randn(n, generator=gen)
    u[::13], g[::13] = 0.5, 0.25  # ties
    u[5::101] = -0.0
    g[7::211] = math.inf
    u[7::211] = 1.0
    return u, g


@pytest.mark.parametrize("split", [False, True])
@pytest.mark.parametrize("nt", [1, 3])
def test_the_band_loop_counts_as_torch_does(nt: int, split: bool) -> None:
    lib = _lib()
    gen = torch.Generator().manual_seed(1)
    u, g = _scores(N + 5, gen)
    a = torch.randn(N + 5, generator=gen)
    s = (a + u) * g
    for lo, hi in [(-0.1, 0.2), (0.125, 0.125), (-math.inf, 0.0), (1.0, math.inf)]:
        uu = u.clone()
        cap = N
        idx, val = torch.empty(cap * nt, dtype=torch.int64), torch.empty(cap * nt)
        counts = torch.empty(2 * nt, dtype=torch.int64)
        lib.band(uu, a, native._split(g) if split else native.Segments.flat(g), lo, hi, idx,
                 val, counts, nt)
        assert torch.equal(uu, a + u)
        blocks = [slice(i * cap, i * cap + int(counts[2 * i + 1])) for i in range(nt)]
        inside = ((s >= lo) & (s <= hi)).nonzero().squeeze(1)
        assert int(counts[0::2].sum()) == int((s > hi).sum())
        assert torch.equal(torch.cat([idx[b] for b in blocks]), inside)
        assert torch.equal(torch.cat([val[b] for b in blocks]), s[inside])


@pytest.mark.parametrize("nt", [1, 4])
@pytest.mark.parametrize("k_frac", [0.01, 0.5, 0.97])
def test_the_step_loop_keeps_torch_topk_set(nt: int, k_frac: float) -> None:
    # x = 0 and no decay: x + u·f is the rounded product u·f with or without a fused multiply-
    # add, so the kept set shows exactly: α·u on the top k (ties to the lower index), γ·u elsewhere
    lib = _lib()
    gen = torch.Generator().manual_seed(2)
    u, g = _scores(N, gen)
    u[u == 0] = 1.0  # every coordinate shows its factor
    s = u * g
    k = math.floor(k_frac * N)
    top = torch.zeros(N, dtype=torch.bool)
    top[torch.sort(s, descending=True, stable=True).indices[:k]] = True
    t = s[top].min()
    ties = ((s == t) & ~top).nonzero()
    cut = N if ties.numel() == 0 else int(ties[0])
    ca, cg = -2.0, -0.5
    for scored in (False, True):
        x = torch.zeros(N)
        segments = native.Segments.flat(s) if scored else native._split(g)  # g: uneven pieces
        lib.step(x, u, segments, float(t), cut, None, ca, cg, scored, nt)
        assert torch.equal(x, u * torch.where(top, ca, cg))


def test_without_a_compiler_the_eager_passes_run(fresh_native, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    monkeypatch.setenv("CC", str(fresh_native / "no-such-compiler"))
    assert native.library() is None and not native.usable(torch.zeros(1))
    assert not list(fresh_native.iterdir())
    path = _choose(_fedact())
    assert path.form == "fused" and "not built here" in path.reason, path


@pytest.mark.slow
def test_the_loops_build_from_the_python_source_alone(fresh_native,  # noqa: ANN001
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    # a Flower App Bundle carries .py files, not .c: the source is the string in native_source.py
    assert not list(Path(native.__file__).parent.glob("*.c"))
    lib = _lib()
    assert lib.path.parent == fresh_native and lib.adam is not None
    monkeypatch.setattr(native, "SOURCE", native.SOURCE + "\n/* changed */\n")
    changed = native._build()  # another source: another key, a fresh build
    assert changed is not None and changed != lib.path and len(list(fresh_native.glob("*.so"))) == 2


@pytest.mark.parametrize("missing", ["no-compiler-found", "cc-path-missing"])
def test_without_a_compiler_one_warning_line_however_many_steps(fresh_native, missing: str,  # noqa: ANN001
                                                                 monkeypatch: pytest.MonkeyPatch,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    if missing == "no-compiler-found":
        monkeypatch.setattr(native, "_compiler", lambda: None)
    else:
        monkeypatch.setenv("CC", str(fresh_native / "no-such-compiler"))
    opt = _fedact()
    with caplog.at_level(logging.INFO, logger=native.__name__):
        for _ in range(5):
            opt.step()
    said = [r for r in caplog.records if r.name == native.__name__]
    assert len(said) == 1 and said[0].levelno == logging.WARNING, said
    assert opt.paths == {"fused": 5}  # no native step


# A C compiler that takes -fopenmp yet links no OpenMP runtime, as zig cc (the compose image's,
# deploy/Dockerfile) does: the library builds, and loading it fails on the runtime's symbols
# (zig: LLVM's __kmpc_*; here one no library defines, as torch's libgomp may be loaded already).
_NO_OPENMP_RUNTIME = """#!{python}
import pathlib, shutil, subprocess, sys
args, cc = sys.argv[1:], shutil.which("cc") or shutil.which("gcc") or "clang"
if "-fopenmp" in args:
    out = args[args.index("-o") + 1]
    runtime_call = pathlib.Path(out + ".omp.c")
    runtime_call.write_text("void __kmpc_not_linked(void); void adaptfl_omp(void) {{ __kmpc_not_linked(); }}")
    args = [*args, str(runtime_call)]
sys.exit(subprocess.call([cc, *args]))
"""


@pytest.mark.slow
def test_a_build_that_does_not_load_is_not_kept(fresh_native, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    """The flags are tried in turn until one's library loads: without OpenMP's runtime the loops
    build again without -fopenmp (single-threaded) and pass the same checks."""
    if native._compiler() is None:
        pytest.skip("no C compiler here: the eager passes run (tested above)")
    compiler = fresh_native / "cc-without-openmp-runtime"
    compiler.write_text(_NO_OPENMP_RUNTIME.format(python=sys.executable))
    compiler.chmod(0o755)
    monkeypatch.setenv("CC", str(compiler))
    monkeypatch.setattr(native, "_tried", False)
    lib = native.library()
    assert lib is not None and lib.adam is not None, "the loops should build without -fopenmp"
    assert not hasattr(lib.dll, "adaptfl_omp")  # the build that loads: no -fopenmp


@pytest.mark.slow
def test_a_build_is_cached_and_a_failed_check_is_not_used(fresh_native,  # noqa: ANN001
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    _lib()
    built = list(fresh_native.glob("*.so"))
    assert len(built) == 1
    monkeypatch.setattr(native, "_tried", False)
    assert native._build() == built[0]  # from the cache: nothing compiled again
    # loops that round differently from torch are refused, and the eager passes run
    monkeypatch.setattr(native.Library, "step", lambda self, x, *rest: x.add_(1e-3))
    monkeypatch.setattr(native, "_tried", False)
    assert native.library() is None


def test_the_accelerator_branch_never_runs_the_loops(accelerator_paths: None) -> None:
    assert not native.usable(torch.zeros(N))
    path = _choose(_fedact())
    assert path.form == "fused" and path.reason.endswith("(the loops take float32 on a CPU)"), path


def _kernel(u: torch.Tensor, g: list[torch.Tensor], m: torch.Tensor, v: torch.Tensor,
            sizes: list[int], step: float, lr: float, betas: tuple[float, float], eps: float) -> None:
    """torch's own fused AdamW kernel per tensor, as `AdamW(fused=True)` and the shell run it."""
    lists = [list(u.split(sizes)), g, list(m.split(sizes)), list(v.split(sizes))]
    torch._fused_adamw_(*lists, [], [torch.tensor(step)] * len(sizes), lr=lr, beta1=betas[0],
                        beta2=betas[1], weight_decay=0.0, eps=eps, amsgrad=False, maximize=False)


@pytest.mark.parametrize("nt", [1, 3])
@pytest.mark.parametrize(("step", "lr", "betas", "eps"), [
    (1.0, -1e-3, (0.9, 0.999), 1e-8), (37.0, -0.45, (0.8, 0.99), 1e-6),
    (math.inf, -2.0, (0.95, 0.9999), 1e-3)])  # inf: no bias correction (`bias_correction=off`)
def test_the_adam_pass_is_torchs_fused_kernel_bit_for_bit(nt: int, step: float, lr: float,
                                                          betas: tuple[float, float], eps: float) -> None:
    lib = _lib()
    if lib.adam is None:
        pytest.skip("no native form matched torch's kernel here: the kernel runs (tested below)")
    gen = torch.Generator().manual_seed(4)
    sizes = [5, 0, 1000, 13, N + 7]  # tails of every length below the vector's, an empty tensor
    n = sum(sizes)
    g = list(torch.randn(n, generator=gen).split(sizes))
    m, v, a = 0.1 * torch.randn(n, generator=gen), torch.rand(n, generator=gen), torch.randn(n, generator=gen)
    v[::17] = 0.0  # sqrt(0): the denominator is ε alone
    u_ref, m_ref, v_ref = a.clone(), m.clone(), v.clone()
    _kernel(u_ref, g, m_ref, v_ref, sizes, step, lr, betas, eps)
    u = torch.empty(n)
    cap = n
    idx, val = torch.empty(cap * nt, dtype=torch.int64), torch.empty(cap * nt)
    counts = torch.empty(2 * nt, dtype=torch.int64)
    offsets = torch.tensor([0, *itertools.accumulate(sizes)])
    coef = kernel_coefficients(*betas, eps, lr, step, torch.empty(6))
    lo, hi = -0.05, 0.1
    lib.adam_band(u, a, m, v, native.Segments(g, offsets), coef, lo, hi, idx, val, counts, nt)
    assert torch.equal(u, u_ref) and torch.equal(m, m_ref) and torch.equal(v, v_ref)
    s = u * torch.cat(g)  # and the band of the scores, as `band` counts it
    blocks = [slice(i * cap, i * cap + int(counts[2 * i + 1])) for i in range(nt)]
    inside = ((s >= lo) & (s <= hi)).nonzero().squeeze(1)
    assert int(counts[0::2].sum()) == int((s > hi).sum())
    assert torch.equal(torch.cat([idx[b] for b in blocks]), inside)


def test_the_kernels_form_is_checked_and_without_one_the_kernel_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    lib = _lib()
    if lib.adam is None:
        pytest.skip("no native form matched torch's kernel here")
    # the forms differ: with the one found left out, no other reproduces the kernel here (a form
    # whose vector body and scalar tail compute alike, as torch's plain-C build under
    # ATEN_CPU_CAPABILITY=default, matches at any vector length: those are left out too)
    vec, kind = lib.adam
    uniform = (kind & 7) == (kind >> 3)
    others = {f for f in native._ADAM_FORMS if f[1] != kind or (f[0] != vec and not uniform)}
    monkeypatch.setattr(native, "_ADAM_FORMS", sorted(others))
    assert native._adam_form(lib) is None
    monkeypatch.setattr(lib, "adam", None)  # as on a torch no form matches: kernel, then the band
    eager, _ = _run(False, monkeypatch, None, 0.01, 0.5)
    fast, used = _run(True, monkeypatch, None, 0.01, 0.5)
    assert "adam" not in used and len(used) == 9
    assert all(torch.equal(a, b) for a, b in zip(eager, fast, strict=True))


@pytest.mark.parametrize("flags", [("-march=native", "-mno-avx512f", "-fopenmp"),  # AVX2 loops
                                   ("-march=native", "-mno-avx512f", "-mno-avx2", "-mno-fma"),
                                   ("-fopenmp",)], ids=["avx2", "no-avx-no-fma", "plain"])
@pytest.mark.slow
def test_other_instruction_sets_build_and_pass_the_checks(fresh_native, flags: tuple[str, ...]) -> None:  # noqa: ANN001
    # CI's CPU builds one set of loops (-march=native); a CPU without AVX-512 (or without AVX)
    # compiles the others, which must pass the same start-up checks against torch bit for bit
    _lib()
    if platform.machine() not in ("x86_64", "AMD64") and flags[0] == "-march=native":
        pytest.skip("x86 instruction-set flags")
    path = native._build((flags,))
    assert path is not None, f"{flags} did not compile"
    lib = native._checked(native.Library(path))
    assert lib is not None and lib.adam is not None


@pytest.mark.parametrize("nt", [1, 3])
@pytest.mark.parametrize("case", ["random", "ties", "signed-zeros", "one-value", "overflow", "outside",
                                  "zero-ties-overflow", "zero-ties-beyond"])
def test_the_pick_is_the_exact_kth_largest_and_its_first_dropped_tie(nt: int, case: str) -> None:
    # the oracle: a stable descending sort of every score (torch.topk's set, ties to the lower index)
    _lib()
    gen = torch.Generator().manual_seed(6)
    n = N + 11
    s = torch.randn(n, generator=gen)
    if case == "ties":
        s = torch.randint(-3, 4, (n,), generator=gen).float() / 4  # seven values, thousands each
    if case == "signed-zeros":
        s[torch.rand(n, generator=gen) < 0.5] = 0.0
        s[::3] = -0.0
    if case == "one-value":
        s.fill_(0.25)
    if case in ("zero-ties-overflow", "zero-ties-beyond"):  # more zeros than a block collects
        s[torch.rand(n, generator=gen) < 0.7] = 0.0
    k = n // 3
    if case in ("zero-ties-overflow", "zero-ties-beyond"):  # t = 0, the first drop among the
        k = int((s > 0).sum()) + (50 if case == "zero-ties-overflow" else 500)  # first 64 zeros, or not
    order = torch.sort(s, descending=True, stable=True).indices
    t = float(s[order[k - 1]])
    dropped = order[k:][s[order[k:]] == t]
    cut = n if dropped.numel() == 0 else int(dropped.min())
    lo, hi = (t - 0.3, t + 0.3) if case in ("random", "overflow", "outside") else (t, t)
    if case == "outside":
        lo, hi = t + 0.01, t + 1.0
    cap = 64 if "overflow" in case or case == "zero-ties-beyond" else n
    idx, val = torch.empty(cap * nt, dtype=torch.int64), torch.empty(cap * nt)
    counts = torch.empty(2 * nt, dtype=torch.int64)
    native.band(torch.ones(n), None, native.Segments.flat(s), lo, hi, idx, val, counts, nt)
    work, ipos = torch.empty(cap * nt + 1), torch.empty(2, dtype=torch.int64)
    picked = native.pick(k, n, lo, hi, idx, val, counts, nt, work, ipos)
    if case in ("overflow", "outside", "zero-ties-beyond"):  # more entries than a block holds
        # (the first dropped tie not among those kept), or t not in the band
        assert picked is None
        return
    assert picked is not None
    got_t, got_cut, m = picked
    assert got_t == t and not (got_t == 0 and math.copysign(1.0, got_t) < 0)  # +0.0 for a zero
    assert got_cut == cut and m == int(((s >= lo) & (s <= hi)).sum())
    if case == "zero-ties-overflow":
        assert m > cap  # selected although a block overflowed
