"""The local step: one readable reference and the fast forms of the same arithmetic.

    reference.py   the step as the papers write it, pure and out of place over C clients'
                   rows [C, D] (sgd, adam/adamw, sophia; correction, trust, move); the cohort
                   engine's batched step and the oracle every form is tested against
    tensors.py     the per-tensor rules' chain (Muon, SOAP): FedPAC's correction after their
                   own step, and FedMIX-P's mixed statistic, as a reader checks them
    selection.py   the exact top-k (a stable sort; ties to the lower index)
    local_step.py  `local_step`: the one door of a `LocalUpdate` step (asks `choose_path`
                   once, runs the chain in that form, repeats FedACT's prepared native step)
    choose.py      `choose_path`: which form runs a `LocalUpdate` step, and why (the one place)
    fused.py       torch's kernels over one flat vector (fused_adam.py: the AdamW kernel pass)
    native.py      FedACT's C loops' call and its prepared step, `Steady` (local_update/native.py
                   builds the loops)
    eager.py       each tensor's own direction, then the chain's generic passes

This package's __init__ imports nothing, so `step.reference` loads without the fast forms.
"""
