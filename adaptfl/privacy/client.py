"""dp='client': the node's own privacy floor, from its node config (`--node-config`, like
data-dir), never from the server. A recipe that asks for less noise than the floor, a larger
clipping norm than the node allows, or names a noise seed is refused by the node in one line
(ValueError: the client app turns it into an error reply naming the reason, which the run records
under `rejected`).

    dp-min-noise-multiplier   the least z the node noises with (default 1.0)
    dp-max-clip-norm          the largest C_Δ it clips to (default 1.0)
    dp-max-state-clip-norm    the largest C_s it clips its other records to (default 1.0)
    dp-testing-reproducible-noise  true: the node accepts a server's dp-seed (tests only)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from adaptfl.core.privacy_settings import Privacy

MIN_NOISE = "dp-min-noise-multiplier"
MAX_CLIP = "dp-max-clip-norm"
MAX_STATE_CLIP = "dp-max-state-clip-norm"
TESTING_SEED = "dp-testing-reproducible-noise"
DEFAULT_FLOOR = {MIN_NOISE: 1.0, MAX_CLIP: 1.0, MAX_STATE_CLIP: 1.0}


def _truthy(value: Any) -> bool:
    return value is True or str(value).strip().lower() in ("1", "true", "yes")


def check_floor(privacy: Privacy, node_config: Mapping[str, Any]) -> None:
    """Refuse (ValueError, one line) a dp='client' recipe below this node's floor."""
    if privacy.dp != "client":
        return
    floor = {key: float(node_config.get(key, default)) for key, default in DEFAULT_FLOOR.items()}
    if privacy.dp_seed >= 0 and not _truthy(node_config.get(TESTING_SEED, False)):
        raise ValueError(f"dp='client' refused by this node: the server names dp-seed={privacy.dp_seed}, "
                         "which would let it subtract this node's noise")
    if privacy.dp_noise_multiplier < floor[MIN_NOISE]:
        raise ValueError(f"dp='client' refused by this node: dp-noise-multiplier="
                         f"{privacy.dp_noise_multiplier:g} is below its {MIN_NOISE}={floor[MIN_NOISE]:g}")
    if privacy.dp_clip_norm > floor[MAX_CLIP]:
        raise ValueError(f"dp='client' refused by this node: dp-clip-norm={privacy.dp_clip_norm:g} "
                         f"is above its {MAX_CLIP}={floor[MAX_CLIP]:g}")
    if privacy.dp_state_clip_norm > floor[MAX_STATE_CLIP]:
        raise ValueError(f"dp='client' refused by this node: dp-state-clip-norm="
                         f"{privacy.dp_state_clip_norm:g} is above its {MAX_STATE_CLIP}="
                         f"{floor[MAX_STATE_CLIP]:g}")
