"""Client side of the second-order optimizers: build the shell from the recipe, Sophia's GNB
gradient (one extra backward through the step's own graph), and the Θ_i upload.

`train.py` calls these three functions only; which optimizer runs is the recipe's
`preconditioner`, and whether Θ is warm-started / mixed is decided by which records the
message carries (`theta`) and by the recipe's λ of the round.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from adaptfl.algorithms.recipe import ClientRecipe
from adaptfl.local_update.second_order import SecondOrderConfig, SecondOrderUpdate
from adaptfl.local_update.sophia import gnb_loss
from adaptfl.local_update.theta import SECOND_ORDER, compress
from adaptfl.workloads import task_loss


def is_second_order(recipe: ClientRecipe) -> bool:
    return recipe.preconditioner in SECOND_ORDER


def second_order_config(recipe: ClientRecipe) -> SecondOrderConfig:
    beta1, beta2 = {"sophia": (recipe.sophia_beta1, recipe.sophia_beta2),
                    "muon": (recipe.muon_momentum, recipe.beta2),  # Muon has one β
                    "soap": (recipe.soap_beta1, recipe.soap_beta2)}[recipe.preconditioner]
    return SecondOrderConfig(
        optimizer=recipe.preconditioner, lr=recipe.lr, weight_decay=recipe.weight_decay,
        beta1=beta1, beta2=beta2, eps=recipe.eps, sophia_rho=recipe.sophia_rho,
        hessian_interval=recipe.hessian_interval, adam_lr=recipe.muon_adam_lr,
        routing=recipe.muon_routing, shampoo_beta=recipe.shampoo_beta,
        precondition_frequency=recipe.precondition_frequency,
        max_precond_dim=recipe.max_precond_dim, lam=recipe.mix_lambda, rho=recipe.rho,
        trust=recipe.trust, tau=recipe.tau, alpha=recipe.alpha, gamma=recipe.gamma,
        trust_scope=recipe.trust_scope, trust_on_muon=recipe.trust_on_muon)


def build_second_order(params: Mapping[str, torch.nn.Parameter], recipe: ClientRecipe,
                       delta_g: Mapping[str, torch.Tensor] | None,
                       theta: Mapping[str, torch.Tensor] | None) -> SecondOrderUpdate:
    device = next(iter(params.values())).device
    ref = None if theta is None else {k: v.to(device) for k, v in theta.items()}
    dg = None if delta_g is None else {k: v.to(device) for k, v in delta_g.items()}
    return SecondOrderUpdate(params.items(), second_order_config(recipe), reference=ref, delta_g=dg)


def gnb_grads(opt: SecondOrderUpdate, params: Mapping[str, torch.nn.Parameter],
              logits: torch.Tensor, y: torch.Tensor) -> dict[str, torch.Tensor] | None:
    """Sophia's ĝ on refresh steps (None otherwise); sets bs = predictions in the batch."""
    opt.bs = y.numel()  # examples, or tokens for a language model
    if not opt.hessian_due():
        return None
    names = [n for n, p in params.items() if p.requires_grad]
    grads = torch.autograd.grad(gnb_loss(logits, task_loss), [params[n] for n in names],
                                retain_graph=True, allow_unused=True)
    return {n: g for n, g in zip(names, grads, strict=True) if g is not None}


def theta_upload(opt: SecondOrderUpdate, recipe: ClientRecipe) -> dict[str, torch.Tensor] | None:
    if not recipe.upload_theta:
        return None
    theta = {k: v.detach().cpu() for k, v in opt.export_theta().items()}
    return compress(theta, recipe.light_c) if recipe.light else theta
