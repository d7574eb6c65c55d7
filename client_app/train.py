"""One round of local training, independent of Flower (the in-process engine calls it too)."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
from adaptfl.algorithms.recipe import ClientRecipe
from adaptfl.client_app.second_order import build_second_order, gnb_grads, is_second_order, theta_upload
from adaptfl.client_app.terms import LocalTerm
from adaptfl.local_update import LocalUpdate, LocalUpdateConfig
from adaptfl.local_update.preconditioners import AdamHyper
from adaptfl.workloads import TaskData, sample_batches, task_loss


@dataclass
class TrainResult:
    delta: dict[str, torch.Tensor]  # x^{r,K} - x^r for every state_dict entry
    v: dict[str, torch.Tensor] | None  # terminal second moment (full or one mean per tensor)
    train_loss: float
    pos_ratio: float
    top_mass: float
    theta: dict[str, torch.Tensor] | None = None  # terminal Θ_i (FedPAC / FedMIX-P), maybe compressed


def round_seed(seed: int, server_round: int, partition_id: int) -> int:
    """A per-(run, round, client) seed, stable across processes and Python versions."""
    digest = hashlib.sha256(f"{seed}/{server_round}/{partition_id}".encode()).digest()
    return int.from_bytes(digest[:7], "little")


def update_config(recipe: ClientRecipe) -> LocalUpdateConfig:
    return LocalUpdateConfig(
        preconditioner=recipe.preconditioner, lr=recipe.lr, weight_decay=recipe.weight_decay,
        adam=AdamHyper(recipe.beta1, recipe.beta2, recipe.eps, recipe.bias_correction),
        rho=recipe.rho, trust=recipe.trust, tau=recipe.tau, alpha=recipe.alpha,
        gamma=recipe.gamma, trust_scope=recipe.trust_scope, step_offset=recipe.step_offset,
        diagnostics=True)


def expand_block_v(v_bar: Mapping[str, torch.Tensor],
                   params: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`block` v-sync sends one value per tensor: broadcast it to the tensor's shape."""
    return {n: v_bar[n].reshape(()).expand_as(p) for n, p in params.items() if n in v_bar}


def train_round(model: torch.nn.Module, data: TaskData, indices: torch.Tensor,
                recipe: ClientRecipe, partition_id: int,
                delta_g: Mapping[str, torch.Tensor] | None,
                v_bar: Mapping[str, torch.Tensor] | None,
                terms: Sequence[LocalTerm] = (),
                theta: Mapping[str, torch.Tensor] | None = None) -> TrainResult:
    """K local steps of the recipe's update on this client's partition.

    `terms` (client_app/terms.py) add to the loss before backward and correct the gradients
    before the step; `train_loss` stays the mean of the plain loss f_i over the steps.
    """
    device = next(model.parameters()).device
    start = {n: t.detach().clone() for n, t in model.state_dict().items()}
    params = dict(model.named_parameters())
    second = is_second_order(recipe)  # Sophia / Muon / SOAP: per-tensor shell, Θ = `theta`
    opt = build_second_order(params, recipe, delta_g, theta) if second else \
        LocalUpdate(params.items(), update_config(recipe), delta_g=delta_g)
    if v_bar is not None and recipe.v_sync != "none":
        warm = expand_block_v(v_bar, params) if recipe.v_sync == "block" else v_bar
        opt.import_state("exp_avg_sq", warm)
    seed = round_seed(recipe.seed, recipe.server_round, partition_id)
    torch.manual_seed(seed)  # dropout etc. in models that have it
    generator = torch.Generator().manual_seed(seed)
    batches = sample_batches(len(indices), recipe.batch_size, recipe.local_steps, generator)
    model.train()
    losses = []
    for batch in batches:
        x, y = data.batch(indices[batch])
        x = x.to(device)
        logits = model(x)
        loss = task_loss(logits, y.to(device))  # images [B,C] or tokens [B,T,V]
        total = loss
        for term in terms:
            extra = term.loss(x, logits)
            total = total if extra is None else total + extra
        g_hat = gnb_grads(opt, params, logits, y) if second else None  # Sophia's GNB ĝ
        opt.zero_grad(set_to_none=True)
        total.backward()
        for term in terms:
            term.correct_(params)
        opt.step(g_hat=g_hat) if second else opt.step()
        losses.append(loss.detach())
    end = model.state_dict()
    delta = {n: (end[n].detach() - start[n]).cpu() for n in start}
    if second:
        return TrainResult(delta=delta, v=None, train_loss=float(torch.stack(losses).mean()),
                           pos_ratio=0.0, top_mass=0.0, theta=theta_upload(opt, recipe))
    return TrainResult(delta=delta, v=_upload_v(opt, recipe.v_sync),
                       train_loss=float(torch.stack(losses).mean()),
                       pos_ratio=_mean(opt.pos_ratios), top_mass=_mean(opt.top_masses))


def _upload_v(opt: LocalUpdate, v_sync: str) -> dict[str, torch.Tensor] | None:
    if v_sync == "none":
        return None
    v = opt.export_state("exp_avg_sq")
    if v_sync == "block":
        return {n: t.mean().reshape(1).cpu() for n, t in v.items()}
    return {n: t.cpu() for n, t in v.items()}


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0
