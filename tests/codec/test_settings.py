"""The codec* keys: every wrong value refused in one line naming its key, before round 1."""

from __future__ import annotations

import pytest
import torch

from adaptfl.algorithms.config import RunConfig
from adaptfl.algorithms.recipe import compression_from_recipe, to_recipe
from adaptfl.codec.codec import Codec
from adaptfl.core import wire
from adaptfl.core.contract import ModelSpec
from adaptfl.strategies import AdaptiveStrategy

F32 = torch.float32
SHAPES = {"conv.weight": (3, 2, 2, 2), "conv.bias": (3,), "fc.weight": (4, 12), "fc.bias": (4,)}
SPEC = ModelSpec({n: (s, F32) for n, s in SHAPES.items()}, tuple(SHAPES))


def _refused(match: str, **kw) -> str:
    with pytest.raises(ValueError, match=match) as err:
        RunConfig.of(**kw)
    assert "\n" not in str(err.value)
    return str(err.value)


@pytest.mark.parametrize("kw,match", [
    (dict(algorithm="fedact", codec_c="int8"),
     r"^codec-c: algorithm 'fedact' shares no such record "
     r"\(it shares \['delta', 'delta-g', 'v', 'v-bar'\]\)"),
    (dict(algorithm="fedavg", codec_v="int8", codec_c="nf4"), r"^codec-c, codec-v: .*remove them$"),
    (dict(algorithm="fedact", codec_delta_g="int8+ef"), r"^invalid codec-delta-g='int8\+ef': error feedback"),
    (dict(algorithm="scaffold", codec_c="top1%+ef"), r"^invalid codec-c='top1%\+ef': error feedback"),
    (dict(codec_block=1), r"^invalid codec-block=1: must be >= 2"),
    (dict(codec_block=(1 << 20) + 1), r"^invalid codec-block=1048577: must be <= 1048576"),
    (dict(codec="top0%"), r"^invalid codec='top0%': top-k keeps between 0 and 100 %"),
    (dict(codec_delta="top100%"), r"^invalid codec-delta='top100%': top-k keeps between 0 and 100 %"),
    (dict(codec="int9"), r"^invalid codec='int9': choose fp32, bf16"),
    (dict(codec_v="nf5", algorithm="fedact"), r"^invalid codec-v='nf5'"),
    (dict(codec_rounding="up"), r"^invalid codec-rounding='up'"),
    (dict(algorithm="fedact", codec_delta_g="rand10%"), r"^invalid codec-delta-g='rand10%': random-k"),
    (dict(algorithm="fedact", codec="rand10%:int2"), r"^invalid codec='rand10%:int2': random-k .* 'delta-g'"),
    (dict(codec_positions="gamma"), r"^invalid codec-positions='gamma'"),
])
def test_refused_in_one_line_naming_the_key(kw, match) -> None:
    _refused(match, **kw)


def test_broadcast_records_never_feed_back_but_replies_do() -> None:
    cfg = RunConfig.of(algorithm="fedact", codec="int8+ef")  # codec's +ef: the replies' records only
    c = cfg.compression
    assert c.of(wire.DELTA) == Codec("int8", 0.0, True) and c.of(wire.V_LOCAL).ef
    assert c.of(wire.DELTA_G) == Codec("int8") and not c.of(wire.V_BAR).ef
    assert c.of(wire.ARRAYS) == Codec()  # the model: always exact
    cfg = RunConfig.of(algorithm="fedact", codec="nf4", codec_delta="top1%:fp4+ef", codec_v_bar="fp32")
    c = cfg.compression
    assert (str(c.of(wire.DELTA)), str(c.of(wire.V_LOCAL)), str(c.of(wire.V_BAR)), str(c.of(wire.DELTA_G))) \
        == ("top1%:fp4+ef", "nf4", "fp32", "nf4")


def test_the_recipe_carries_the_codecs_to_the_client() -> None:
    cfg = RunConfig.of(algorithm="fedact", codec="int8", codec_delta="top5%:nf4+ef", codec_block=32,
                       codec_rounding="stochastic")
    recipe = to_recipe(cfg.algorithm, cfg.round_info(1, "k"), compression=cfg.compression)
    assert recipe["compression.codec"] == "int8" and recipe["compression.codec-block"] == 32
    assert compression_from_recipe(recipe) == cfg.compression
    lossless = to_recipe(cfg.algorithm, cfg.round_info(1, "k"), compression=RunConfig.of().compression)
    assert not [k for k in lossless if k.startswith("compression.")]


@pytest.mark.parametrize(("kw", "named"), [
    (dict(codec="int8"), "theta, theta-i hold symmetric PSD statistics (SOAP), which the lossy codec 'int8' "
                         "breaks value by value; set codec-theta='fp32' codec-theta-i='fp32'"),
    (dict(codec_theta="bf16"), "theta holds symmetric PSD statistics (SOAP), which the lossy codec 'bf16' "
                               "breaks value by value; set codec-theta='fp32'"),
    (dict(codec_theta_i="top50%"), "theta-i holds symmetric PSD statistics (SOAP), which the lossy codec "
                                   "'top50%' breaks value by value; set codec-theta-i='fp32'")])
def test_a_lossy_codec_on_soaps_psd_theta_is_refused_at_initialize(kw, named) -> None:
    strategy = AdaptiveStrategy(RunConfig.of(algorithm="fedpac-soap", local_steps=2, lr=0.5,
                                             lr_schedule="constant", max_precond_dim=6, **kw))
    with pytest.raises(ValueError) as refused:
        strategy.initialize({n: torch.zeros(s) for n, s in SHAPES.items()}, SPEC)
    assert str(refused.value) == named


def test_soap_takes_a_lossy_codec_on_its_other_records() -> None:
    strategy = AdaptiveStrategy(RunConfig.of(algorithm="fedpac-soap", local_steps=2, lr=0.5,
                                             lr_schedule="constant", max_precond_dim=6, codec="int8",
                                             codec_theta="fp32", codec_theta_i="fp32"))
    strategy.initialize({n: torch.zeros(s) for n, s in SHAPES.items()}, SPEC)
    assert strategy.cfg.compression.of(wire.DELTA) == Codec("int8")
