"""The README's "Using adaptfl in your own Flower app" block is a complete app as shown (issue 20
§1c): taken from README.md as it is, written to `my_app.py`, imported, and its ServerApp's main
run over two of its ClientApps (adaptfl's in-process grid instead of Flower's transport: the
same Strategy.start and messages). Three rounds must train: every reply accepted, the central
accuracy (its evaluate_fn) up from the initial model's."""

from __future__ import annotations

import importlib
import re
import sys

from flwr.app import Context, MetricRecord, RecordDict

from adaptfl.engine.inprocess import InProcessGrid
from tests.support.flower_processes import PROJECT

SECTION = "## Using adaptfl in your own Flower app"


def _snippet() -> str:
    text = (PROJECT / "README.md").read_text()
    section = text[text.index(SECTION):]
    section = section[:section.index("\n## ", len(SECTION))]
    blocks = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    assert len(blocks) == 1, "the section shows one python block: the whole app"
    return blocks[0]


def test_the_readme_flower_app_runs_as_shown(tmp_path, monkeypatch) -> None:
    (tmp_path / "my_app.py").write_text(_snippet())
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("my_app", None)
    app = importlib.import_module("my_app")
    assert {"server", "client"} <= set(vars(app))  # the names the README's pyproject lines give
    accuracies: dict[int, float] = {}
    evaluate = app.evaluate

    def recorded(server_round, arrays):  # noqa: ANN001, ANN202 - the app's own evaluate_fn
        out = evaluate(server_round, arrays)
        assert isinstance(out, MetricRecord)
        accuracies[server_round] = float(out["accuracy"])
        return out

    monkeypatch.setattr(app, "evaluate", recorded)
    rejected = []
    grid = InProcessGrid(2, {}, handler=lambda msg, ctx: _checked(app.train(msg, ctx), rejected))
    app.main(grid, Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config={}))
    assert sorted(accuracies) == [0, 1, 2, 3] and not rejected
    assert accuracies[3] > accuracies[0] + 0.2, accuracies  # 3 classes: chance is 1/3
    sys.modules.pop("my_app", None)


def _checked(reply, rejected: list):  # noqa: ANN001, ANN202
    if reply.has_error():
        rejected.append(reply.error.reason)
    return reply
