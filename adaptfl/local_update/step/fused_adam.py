"""torch's fused AdamW kernel as the fused form's direction pass for Adam and AdamW (the rules
themselves, rules/adam.py, stay pure: a fresh d from g and the state)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from adaptfl.local_update.rules.adam import kernel_arguments

FUSED_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
# True: the eager passes instead of torch's fused kernel, bit for bit the plain formula of the
# tests (tests/local_update/test_local_update_fast_paths.py); the fused kernel rounds a few ulps apart.
EAGER = False


def fuses(g: torch.Tensor) -> bool:
    """Whether `adam_direction_` runs torch's fused kernel on tensors like g."""
    return not EAGER and g.dtype in FUSED_DTYPES and g.device.type in ("cpu", "cuda")


@dataclass
class FusedAdamPass:
    """One call of torch's fused AdamW kernel over `out` holding `addend` (or 0), no weight decay,
    with a negative lr: out = addend - lr·m̂/(sqrt(v̂)+ε) per the kernel's float operations,
    m and v updated. Deferred, so that FedACT's native loops may do the same work bit for bit
    in their first pass (step/native.py's `act`) instead; `run` does it here otherwise."""

    lists: tuple[list[torch.Tensor], ...]  # out, g, exp_avg, exp_avg_sq: per tensor, or one each
    out: torch.Tensor
    addend: torch.Tensor | None
    exp_avg: torch.Tensor  # flat, the memory of lists[2] and lists[3]
    exp_avg_sq: torch.Tensor
    lr: float
    beta1: float
    beta2: float
    eps: float
    step: float  # the kernel's step count (inf: no bias correction)

    def run(self) -> None:
        if self.addend is None:
            self.out.zero_()
        elif self.addend is not self.out:
            self.out.copy_(self.addend)
        step = torch.full((), self.step, dtype=torch.float32, device=self.out.device)
        # mypy cannot match the unpacked *self.lists to the overloads' positional tensor lists
        torch._fused_adamw_(*self.lists, [], [step] * len(self.lists[0]), lr=self.lr,  # type: ignore[call-overload]
                            beta1=self.beta1, beta2=self.beta2, weight_decay=0.0, eps=self.eps,
                            amsgrad=False, maximize=False)


def adam_direction_(exp_avg: torch.Tensor, exp_avg_sq: torch.Tensor, g: torch.Tensor,
                    beta1: float, beta2: float, eps: float, n_m: int, n_v: int,
                    out: torch.Tensor | None = None, mix: float = 1.0,
                    addend: torch.Tensor | None = None,
                    split: tuple[list[torch.Tensor], ...] | None = None,
                    defer: bool = False) -> tuple[torch.Tensor, float, FusedAdamPass | None]:
    """(d, scale) with scale·d = m̂ / (sqrt(v̂) + ε); updates m and v in place; d is written to
    `out` (fresh if None). With `addend`, d is addend + mix·m̂ / (sqrt(v̂) + ε) and scale 1.
    n_m, n_v: the exponents of the bias corrections 1-β^n (0: none).

    By default one pass of torch's own fused AdamW kernel (`torch._fused_adamw_`, what
    `torch.optim.AdamW(fused=True)` runs) over a buffer that holds the addend (or 0), with a
    negative lr: it leaves addend + mix·m̂/(sqrt(v̂)+ε) there, m and v updated. The kernel takes
    one step count for both corrections: it gets n_v, and lr carries bc1(n_v)/bc1(n_m) for m.
    `EAGER` (the tests' bit-exact reference) computes the same in six eager passes instead.
    `split` (fused kernel only, `fuses`): (out, g, m, v) as per-tensor lists of the same memory
    as out, m and v, g the gradients where they lie; g itself is then not read.
    The third result is None, or with `defer` (fused kernel only) the kernel's pass not run yet.
    """
    if out is None:
        out = torch.empty_like(g)
    if fuses(g):
        lr, step = kernel_arguments(beta1, n_m, n_v, mix if addend is not None else 1.0)
        kernel = FusedAdamPass(([out], [g], [exp_avg], [exp_avg_sq]) if split is None else split,
                               out, addend, exp_avg, exp_avg_sq, lr, beta1, beta2, eps, step)
        if defer:
            return out, 1.0, kernel
        kernel.run()
        return out, 1.0, None
    exp_avg.lerp_(g, 1.0 - beta1)
    exp_avg_sq.mul_(beta2).addcmul_(g, g, value=1.0 - beta2)
    bc1 = 1.0 - beta1**n_m if n_m else 1.0
    root_bc2 = math.sqrt(1.0 - beta2**n_v) if n_v else 1.0
    # m̂/(sqrt(v̂)+ε) = (sqrt(bc2)/bc1)·m / (sqrt(v) + ε·sqrt(bc2)): the corrections as scalars
    denom = torch.sqrt(exp_avg_sq, out=out).add_(eps * root_bc2)
    scale = root_bc2 / bc1
    if addend is not None:
        return torch.addcdiv(addend, exp_avg, denom, value=mix * scale, out=denom), 1.0, None
    return torch.div(exp_avg, denom, out=denom), scale, None


