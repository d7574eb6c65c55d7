"""A run's results dir (issue 13 §2, §3): a run-name is not silently reused, a crash during the
round-1 checkpoint leaves no duplicate row, model.pt and state.pt are replaced atomically and
fsynced with their folder, and a job continued from another dir's checkpoint is a new job for
its clients' durable state."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from adaptfl.algorithms.config import RunConfig
from adaptfl.core import durable
from adaptfl.engine.inprocess import InProcessGrid
from adaptfl.server_app import checkpoint, loop, outputs
from adaptfl.server_app.checkpoint import STATE_FILE
from adaptfl.server_app.loop import build_run, restore_or_start, run_federated
from adaptfl.server_app.outputs import RunOutputs
from adaptfl.strategies.state import ServerState
from tests.support.run_outputs import final_model, metric_rows


def _cfg(tiny_data, tmp_path: Path, **kw) -> RunConfig:
    values = dict(accept_small_rounds=True,  # rounds of one or two nodes
                  model="mlp", algorithm="fedavg", num_server_rounds=2, local_steps=2, batch_size=16,
                  data_dir=tiny_data["fashion-mnist"], figures=False, results_dir=str(tmp_path), run_name="r",
                  client_state_dir=str(tmp_path / "state"))
    return RunConfig.of(**{**values, **kw})


def _run(cfg: RunConfig) -> Path:
    return run_federated(InProcessGrid(2, cfg.to_flower()), cfg)


@pytest.mark.slow
def test_a_run_name_in_use_is_refused_before_round_1(tiny_data, tmp_path) -> None:
    out = _run(_cfg(tiny_data, tmp_path))
    before = (out / "metrics.jsonl").read_bytes(), (out / "model.pt").read_bytes()
    with pytest.raises(ValueError, match=r"holds a run already .*resume=true.*overwrite=true"):
        _run(_cfg(tiny_data, tmp_path, seed=5))
    assert ((out / "metrics.jsonl").read_bytes(), (out / "model.pt").read_bytes()) == before
    # overwrite=true replaces it: two rows, not four, and the new model
    _run(_cfg(tiny_data, tmp_path, seed=5, overwrite=True))
    assert [r["round"] for r in metric_rows(out)] == [1, 2]
    assert (out / "model.pt").read_bytes() != before[1]
    # resume=true of a finished run adds nothing
    _run(_cfg(tiny_data, tmp_path, seed=5, resume=True))
    assert [r["round"] for r in metric_rows(out)] == [1, 2]


def test_unnamed_runs_started_in_the_same_second_get_their_own_dirs(tmp_path) -> None:
    cfg = RunConfig.of(figures=False, results_dir=str(tmp_path))
    first, second = RunOutputs(cfg), RunOutputs(cfg)
    assert first.dir != second.dir and second.dir.name.startswith(first.dir.name)


@pytest.mark.slow
def test_a_crash_in_the_round_1_checkpoint_leaves_no_duplicate_row(tiny_data, tmp_path,
                                                                   monkeypatch) -> None:
    cfg = _cfg(tiny_data, tmp_path)

    def killed(run_dir: Path, state: ServerState) -> None:
        raise KeyboardInterrupt("killed while writing the round-1 checkpoint")

    monkeypatch.setattr(loop, "save_checkpoint", killed)
    with pytest.raises(KeyboardInterrupt):
        _run(cfg)
    out = tmp_path / "r"
    assert [r["round"] for r in metric_rows(out, initial=True)] == [0, 1]
    assert not (out / STATE_FILE).exists()
    monkeypatch.undo()
    _run(cfg.replace(resume=True))  # nothing was checkpointed: starts at round 1 again
    assert [r["round"] for r in metric_rows(out, initial=True)] == [0, 1, 2]


@pytest.mark.slow
def test_a_kill_while_resume_rewrites_the_rows_loses_none(tiny_data, tmp_path, monkeypatch) -> None:
    """Resume trims metrics.jsonl to the checkpoint's rounds; a kill meanwhile must leave the old
    rows (the next resume trims them again), not an emptied file."""
    cfg = _cfg(tiny_data, tmp_path)
    out = _run(cfg)
    before = (out / "metrics.jsonl").read_text()
    with (out / "metrics.jsonl").open("a") as fh:  # a row newer than the checkpoint
        fh.write(before.splitlines()[-1].replace('"round": 2', '"round": 3') + "\n")

    def killed(*args: object) -> None:
        raise KeyboardInterrupt("killed while rewriting the rows")

    opened = RunOutputs(cfg.replace(resume=True))
    monkeypatch.setattr(outputs, "write_atomic", killed)
    monkeypatch.setattr(outputs, "append_durable", killed)
    with pytest.raises(KeyboardInterrupt):
        opened.restore(metric_rows(out, initial=True)[:3])  # rounds 0-2, as resume does
    assert (out / "metrics.jsonl").read_text().startswith(before)  # every row still there
    monkeypatch.undo()
    _run(cfg.replace(resume=True))  # trims round 3, adds nothing (round 2 was the last)
    assert (out / "metrics.jsonl").read_text() == before


@pytest.mark.slow
def test_model_and_checkpoint_are_replaced_atomically_and_fsynced(tiny_data, tmp_path,
                                                                  monkeypatch) -> None:
    synced: list[str] = []
    real_fsync = os.fsync

    def recording_fsync(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    monkeypatch.setattr(durable.os, "fsync", recording_fsync)
    out = _run(_cfg(tiny_data, tmp_path))
    for path in (out / "state.pt.tmp", out / "model.pt.tmp", out / "metrics.jsonl", out):
        assert str(path) in synced, path  # the file's bytes, then the rename in its folder
    assert not list(out.glob("*.tmp"))

    # a crash while the new model is written leaves the old one whole
    old = (out / "model.pt").read_bytes()

    def crash(src: object, dst: object) -> None:
        raise OSError("power cut")

    monkeypatch.setattr(durable.os, "replace", crash)
    with pytest.raises(OSError, match="power cut"):
        RunOutputs(_cfg(tiny_data, tmp_path, overwrite=True)).finish({"w": torch.ones(3)})
    assert (out / "model.pt").read_bytes() == old


@pytest.mark.slow
def test_resume_from_another_dir_is_a_new_job_for_the_clients(tiny_data, tmp_path) -> None:
    source = _run(_cfg(tiny_data, tmp_path, num_server_rounds=1))
    key = ServerState.load(source / STATE_FILE).run_key
    # the same job continues: same dir, same key (the clients find their state)
    same = _cfg(tiny_data, tmp_path, num_server_rounds=1, resume=True)
    strategy = build_run(same)[0]
    restore_or_start(same, strategy)
    assert strategy.state.run_key == key
    also_same = _cfg(tiny_data, tmp_path, num_server_rounds=1, resume_from=str(source))
    strategy = build_run(also_same)[0]
    restore_or_start(also_same, strategy)
    assert strategy.state.run_key == key
    # a continuation elsewhere is a fork: its own key, so two forks never share client state
    fork = _cfg(tiny_data, tmp_path, num_server_rounds=1, resume_from=str(source), run_name="fork")
    strategy = build_run(fork)[0]
    restore_or_start(fork, strategy)
    assert strategy.state.run_key != key and strategy.state.server_round == 1
    assert checkpoint.continues_same_job(source, tmp_path / "r")
    # a continuation into a dir that holds another run is refused like a fresh run
    _run(_cfg(tiny_data, tmp_path, num_server_rounds=1, run_name="other"))
    with pytest.raises(ValueError, match="other holds a run already"):
        _run(_cfg(tiny_data, tmp_path, num_server_rounds=1, resume_from=str(source),
                  run_name="other", resume=True))


@pytest.mark.slow
def test_resuming_with_another_config_is_refused_and_leaves_the_dir_as_it_was(tiny_data,
                                                                            tmp_path) -> None:
    """seed 1 -> 2 changes what the run computes: another job, not a continuation (raising
    num-server-rounds is one: tests/server_app/test_resume.py)."""
    out = _run(_cfg(tiny_data, tmp_path, num_server_rounds=1, seed=1))
    model = final_model(out)
    with pytest.raises(ValueError, match=r"seed: 1 -> 2"):
        _run(_cfg(tiny_data, tmp_path, num_server_rounds=1, seed=2, resume=True))
    assert torch.equal(final_model(out)["1.weight"], model["1.weight"])


class _FlowerLikeGrid(InProcessGrid):
    static_nodes = False  # as under Flower: the nodes are known at round 1 only


@pytest.mark.slow
def test_a_run_refused_at_round_1_leaves_nothing_and_the_retry_runs(tiny_data, tmp_path) -> None:
    """Under Flower the nodes (and so dp's plan) are known at round 1, after the results folder is
    opened: the refused run removes its folder, so the same run-name starts afresh."""
    refused = _cfg(tiny_data, tmp_path, dp="central", weighting="uniform", fraction_train=0.2,
                   local_steps=1, batch_size=8)  # ε ≈ 12.7 > dp-accept-epsilon's 10
    with pytest.raises(ValueError, match="plans ε="):
        run_federated(_FlowerLikeGrid(10, refused.to_flower()), refused)
    assert not (tmp_path / "r").exists()
    accepted = refused.replace(dp_accept_epsilon=20.0)
    out = run_federated(_FlowerLikeGrid(10, accepted.to_flower()), accepted)
    assert [r["round"] for r in metric_rows(out)] == [1, 2]


def test_a_folder_with_no_completed_round_is_not_offered_for_resume(tiny_data, tmp_path) -> None:
    cfg = _cfg(tiny_data, tmp_path)
    run_dir = tmp_path / "r"
    run_dir.mkdir()
    (run_dir / "metrics.jsonl").write_text('{"round": 0}\n')  # an earlier start that trained nothing
    with pytest.raises(ValueError) as refused:
        _run(cfg)
    assert "completed no round" in str(refused.value) and "resume" not in str(refused.value)
    assert "overwrite=true" in str(refused.value)
