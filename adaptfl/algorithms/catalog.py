"""The named algorithms: compositions of components with the papers' defaults.

A preset fixes the structure (which components) and any field that differs from the
component's own default (FedACT's bias correction, FedLADA's Adam without one); numbers come
from the components' declarations unless the run config sets them. lr and weight decay default
to the preconditioner's (SGD 0.1 / 1e-3 as FedACT's Table 6; the Adam family 1e-3; the second-
order optimizers their authors' values).
"""

from __future__ import annotations

from functools import cache

from adaptfl.algorithms.algorithm import Algorithm
from adaptfl.algorithms.components.correction import (
    FedCMCorrection,
    FedLADACorrection,
    FedPACCorrection,
    GlobalDirection,
    NoCorrection,
)
from adaptfl.algorithms.components.feddyn import FedDyn
from adaptfl.algorithms.components.hafedho import HaFedHo
from adaptfl.algorithms.components.local_state import Fresh, Persist
from adaptfl.algorithms.components.mimelite import MimeLite
from adaptfl.algorithms.components.moments import FullSync, NoSync
from adaptfl.algorithms.components.moon import Moon
from adaptfl.algorithms.components.prox import Prox
from adaptfl.algorithms.components.scaffold import Scaffold
from adaptfl.algorithms.components.sharing import Align, Mix, NoSharing
from adaptfl.core.suggest import did_you_mean
from adaptfl.local_update.modulation import ACT, NoTrust
from adaptfl.local_update.rules.adam import Adam, AdamW
from adaptfl.local_update.rules.muon import Muon
from adaptfl.local_update.rules.sgd import SGD
from adaptfl.local_update.rules.soap import SOAP
from adaptfl.local_update.rules.sophia import Sophia
from adaptfl.server_rules.aggregators.mean import Mean
from adaptfl.server_rules.server_opt.adagrad import ServerAdagrad
from adaptfl.server_rules.server_opt.adam import ServerAdam
from adaptfl.server_rules.server_opt.adamom import Adamom
from adaptfl.server_rules.server_opt.avgm import AvgM
from adaptfl.server_rules.server_opt.nesterov import Nesterov
from adaptfl.server_rules.server_opt.none import Average
from adaptfl.server_rules.server_opt.yogi import ServerYogi


def _algorithm(name: str, paper: str, preconditioner: object, **parts: object) -> Algorithm:
    base = dict(correction=NoCorrection(), trust=NoTrust(), moments=NoSync(), sharing=NoSharing(),
                server_opt=Average(), aggregator=Mean(), terms=(), local_state=Fresh())
    return Algorithm(name, paper, preconditioner, **{**base, **parts})  # type: ignore[arg-type]


@cache
def catalog() -> dict[str, Algorithm]:
    sgd, paper_adamw = SGD(), AdamW(bias_correction="paper")
    algorithms = [
        _algorithm("fedavg", "McMahan et al. 2017", sgd),
        _algorithm("localadam", "local Adam, FedAvg of models", Adam(bias_correction="local")),
        _algorithm("localadamw", "local AdamW, FedAvg of models", AdamW(bias_correction="local")),
        _algorithm("fedadamw", "Liu et al. 2026 (FedAdamW)", paper_adamw,
                   correction=GlobalDirection(), moments=FullSync()),
        _algorithm("fedact", "seed 000 (FedACT)", paper_adamw, correction=GlobalDirection(),
                   trust=ACT(), moments=FullSync()),
        _algorithm("fedact-local", "seed 000, ρ=0 ablation", paper_adamw, trust=ACT(),
                   moments=FullSync()),
        _algorithm("fedavgm", "Hsu et al. 2019 (FedAvgM)", sgd, server_opt=AvgM()),
        _algorithm("fedadam", "Reddi et al. 2021 (FedAdam)", sgd, server_opt=ServerAdam()),
        _algorithm("fedyogi", "Reddi et al. 2021 (FedYogi)", sgd, server_opt=ServerYogi()),
        _algorithm("fedadagrad", "Reddi et al. 2021 (FedAdagrad)", sgd, server_opt=ServerAdagrad()),
        _algorithm("fedadamom", "seed 004 (FedAdamom)", sgd, server_opt=Adamom()),
        _algorithm("hafedho", "seed 003 (HaFedHo)", sgd, terms=(HaFedHo(),)),
        _algorithm("fedprox", "Li et al. 2020 (FedProx)", sgd, terms=(Prox(),)),
        _algorithm("scaffold", "Karimireddy et al. 2020 (SCAFFOLD, option II)", sgd, terms=(Scaffold(),)),
        _algorithm("fedcm", "Xu et al. 2021 (FedCM)", sgd, correction=FedCMCorrection()),
        _algorithm("fedlada", "Sun et al. 2023 (FedLADA)", Adam(bias_correction="off"),
                   correction=FedLADACorrection(), moments=FullSync()),
        _algorithm("feddyn", "Acar et al. 2021 (FedDyn)", sgd, terms=(FedDyn(),)),
        _algorithm("moon", "Li, He & Song 2021 (MOON)", sgd, terms=(Moon(),)),
        _algorithm("mimelite", "Karimireddy et al. 2021 (MimeLite)", sgd, correction=MimeLite()),
    ]
    # Cross-datacenter pre-training recipes: inner optimizer state kept on each worker, outer
    # Nesterov momentum on p = -mean Δ (DiLoCo's Alg. 1: inner AdamW β = (0.9, 0.95), wd 0.1;
    # outer lr 0.7, momentum 0.9, the Nesterov component's defaults)
    diloco = dict(server_opt=Nesterov(), local_state=Persist())
    diloco_adamw = AdamW(beta2=0.95, bias_correction="local")
    algorithms += [
        _algorithm("diloco", "Douillard et al. 2023 (DiLoCo)", diloco_adamw, weight_decay=0.1, **diloco),
        _algorithm("muloco", "Thérien et al. 2025 (MuLoCo)", Muon(), **diloco),
        # FedACT's trust modulation on DiLoCo's inner steps: no published system has it
        _algorithm("diloco-act", "new: DiLoCo + seed 000's trust (ACT)", diloco_adamw, trust=ACT(),
                   weight_decay=0.1, **diloco),
    ]
    for rule in (Sophia(), Muon(), SOAP()):
        x = rule.name
        algorithms += [
            _algorithm(f"local-{x}", f"local {x}, FedAvg of models, state never shared", rule),
            _algorithm(f"fedpac-{x}", "seed 001 (FedPAC)", rule, correction=FedPACCorrection(),
                       sharing=Align()),
            _algorithm(f"fedmixp-{x}", "seed 002 (FedMIX-P)", rule, sharing=Mix()),
        ]
    return {a.name: a for a in algorithms}


def get_algorithm(name: str) -> Algorithm:
    known = catalog()
    if name not in known:
        raise ValueError(f"unknown algorithm {name!r}{did_you_mean(name, known)}; choose one of "
                         f"{sorted(known)}")
    return known[name]
