"""What a run leaves for its user: metrics (JSONL + CSV), a plot, the model, the config."""

from __future__ import annotations

import csv
import io
import json
import logging
import shutil
import time
from importlib import metadata
from pathlib import Path
from typing import Any
from urllib.parse import urlparse
from urllib.request import url2pathname

import torch

from adaptfl.algorithms.config import RunConfig
from adaptfl.core.durable import append_durable, write_atomic
from adaptfl.core.json_rows import json_line
from adaptfl.privacy.release import CONFIDENTIAL_FILE, append_confidential, released, write_confidential
from adaptfl.server_app.checkpoint import STATE_FILE
from adaptfl.server_app.columns import COLUMNS, JSONL
from adaptfl.server_app.mlflow_log import MlflowRun, mlflow_client_class
from adaptfl.server_app.plots import plot_run
from adaptfl.server_app.tensorboard import open_writer, write_row

log = logging.getLogger(__name__)


def project_dir() -> Path | None:
    """The source checkout adaptfl was installed from with `pip install -e .`, if any.

    The ServerApp runs in the SuperLink's working directory, so `Path.cwd()` is no guide.
    """
    try:
        raw = metadata.distribution("adaptfl").read_text("direct_url.json")
    except metadata.PackageNotFoundError:
        return None
    return editable_checkout(raw or "{}")


def editable_checkout(direct_url_json: str) -> Path | None:
    """The folder named by an editable install's PEP 610 `direct_url.json`, else None.

    A plain `pip install .` (as in deploy/Dockerfile) also records `file://` plus `dir_info`, but
    its source folder is only a build input (`/src` inside the image): results written there
    would miss the results volume and vanish with the container. Only `editable: true` marks a
    checkout that the user works in.
    """
    info = json.loads(direct_url_json)
    url = info.get("url", "")
    if not (url.startswith("file://") and info.get("dir_info", {}).get("editable", False)):
        return None
    return Path(url2pathname(urlparse(url).path))


def results_root(cfg: RunConfig) -> Path:
    if cfg.output.results_dir:
        root = Path(cfg.output.results_dir).expanduser()
        if not root.is_absolute():
            raise ValueError(f"results-dir={cfg.output.results_dir!r} must be an absolute path: the "
                             "ServerApp runs in the SuperLink's working directory")
        return root
    project = project_dir()
    return project / "results" if project else Path.home() / ".adaptfl" / "results"


def unused_name(root: Path, name: str) -> str:
    """`name`, or `name-2`, `name-3`, … where two runs start in the same second."""
    candidate, n = name, 1
    while (root / candidate).exists():
        n += 1
        candidate = f"{name}-{n}"
    return candidate


class RunOutputs:
    """One run's results directory. Under dp the files meant to be shared get only the
    whitelisted part of each row (privacy/release.py) and server-confidential.jsonl the whole
    row; `rows` are the whole rows, for the server's own use."""

    def __init__(self, cfg: RunConfig) -> None:
        client_class = mlflow_client_class() if cfg.output.mlflow else None  # refused before any write
        name = cfg.output.run_name or unused_name(results_root(cfg),
                                                  f"{cfg.algorithm.name}-{time.strftime('%Y%m%d-%H%M%S')}")
        self.dir = results_root(cfg) / name
        self.created = not self.dir.exists()  # a refused run removes only a folder it made
        self.dir.mkdir(parents=True, exist_ok=True)
        write_atomic(self.dir / "config.json", json.dumps(cfg.to_flower(), indent=2).encode())
        self.rows: list[dict[str, Any]] = []
        self.private = cfg.privacy.on
        self.title = cfg.title()
        self.figures = cfg.output.figures
        self.tensorboard = open_writer(self.dir) if cfg.output.tensorboard else None
        self.mlflow = MlflowRun(client_class, self.dir, self.dir.name, cfg.to_flower()) \
            if client_class is not None else None
        log.info("results of this run go to %s", self.dir)

    def restore(self, rows: list[dict[str, Any]]) -> None:
        """Start from a checkpoint's rows: replace the files so they hold exactly those rounds
        (at once: a kill meanwhile leaves the old rows, which the next resume trims again)."""
        if self.private:
            write_confidential(self.dir, list(rows))
        else:  # an overwritten dp run's confidential rows are not this run's
            (self.dir / CONFIDENTIAL_FILE).unlink(missing_ok=True)
        public = [self.public(r) for r in rows]
        write_atomic(self.dir / "metrics.jsonl", "".join(map(json_line, public)).encode())
        self.rows = list(rows)
        self._write_csv()
        if self.tensorboard is not None:
            for row in public:
                write_row(self.tensorboard, row)
        if self.mlflow is not None:
            for row in public:
                self.mlflow.log_row(row)

    def public(self, row: dict[str, Any]) -> dict[str, Any]:
        """What of `row` the shared outputs get: all of it, or under dp the whitelist."""
        return released(row) if self.private else row

    def record(self, row: dict[str, Any]) -> None:
        """Append one round's metrics to metrics.jsonl (under dp: its released part, the whole
        row to server-confidential.jsonl) and rewrite metrics.csv."""
        self.rows.append(row)
        if self.private:  # both before the checkpoint: resume reads the whole rows back
            append_confidential(self.dir, row)
        append_durable(self.dir / "metrics.jsonl", json_line(self.public(row)))
        self._write_csv()
        if self.tensorboard is not None:
            write_row(self.tensorboard, self.public(row))
        if self.mlflow is not None:
            self.mlflow.log_row(self.public(row))

    def _write_csv(self) -> None:
        public = [self.public(r) for r in self.rows]
        nested = [name for name, (where, _) in COLUMNS.items() if where == JSONL]  # JSONL only
        columns = list(dict.fromkeys(k for r in public for k in r if k not in nested))
        with (self.dir / "metrics.csv").open("w", newline="") as fh:
            writer = csv.DictWriter(fh, fieldnames=columns, extrasaction="ignore")
            writer.writeheader()
            writer.writerows(public)

    def finish(self, model_state: dict[str, torch.Tensor]) -> None:
        buffer = io.BytesIO()
        torch.save(model_state, buffer)
        write_atomic(self.dir / "model.pt", buffer.getvalue())  # never a half-written model
        self.plot()
        if self.mlflow is not None:
            self.mlflow.end("FINISHED")

    def abort(self, interrupted: bool = False) -> None:
        """The run stopped before its end (RunAborted, an error, an interrupt): the MLflow run
        says so; the files keep the rounds completed so far."""
        if self.mlflow is not None:
            try:
                self.mlflow.end("KILLED" if interrupted else "FAILED")
            except Exception as err:  # noqa: BLE001 - the run's own error is the one to raise
                log.warning("the MLflow run could not be marked as ended: %s", err)

    def discard(self) -> None:
        """A run refused before its first checkpoint (round 1's checks need the nodes, so under
        Flower they come after the folder): nothing of it stays, so the retry under the same
        run-name starts afresh. Only a folder this run made is removed."""
        if self.tensorboard is not None:
            self.tensorboard.close()
        if self.created and not (self.dir / STATE_FILE).exists():
            shutil.rmtree(self.dir, ignore_errors=True)
            log.info("the run was refused before round 1: removed %s", self.dir)

    def plot(self) -> None:
        if self.figures:
            plot_run([self.public(r) for r in self.rows], self.dir, self.title)
        if self.tensorboard is not None:
            self.tensorboard.close()
