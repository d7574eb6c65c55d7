"""deploy/compose-check.sh: docs/deployment.md runs exactly its commands, it refuses a small disk, and
(marked `docker`, opt-in) it passes end to end where a Docker engine can run."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from flwr.common.config import parse_config_args

from adaptfl.algorithms.config import RunConfig
from adaptfl.deploy import compose_check
from adaptfl.engine.inprocess import InProcessGrid
from adaptfl.server_app.loop import run_federated

ROOT = Path(__file__).resolve().parents[2]


def _docs_compose_block() -> str:
    page = (ROOT / "docs" / "deployment.md").read_text()
    section = page[page.index("### docker compose"):]
    found = re.search(r"```bash\n(.*?)\n```", section, re.S)
    assert found, "no bash block in the compose section of docs/deployment.md"
    return found.group(1)


def test_the_documented_compose_section_is_what_the_check_runs() -> None:
    assert _docs_compose_block() == compose_check.readme_block()


def test_the_image_is_built_once_and_both_variants_start_from_it() -> None:
    commands = [(phase, c) for phase, cmds in compose_check.PHASES.items() for c in cmds]
    builds = [phase for phase, c in commands if re.search(r"\$COMPOSE .* build\b", c)]
    assert builds == ["images"], builds
    ups = [(phase, c) for phase, c in commands if " up -d" in c]
    assert {phase for phase, _ in ups} == {"insecure", "tls"}
    assert all(" up -d --no-build" in c for _, c in ups), ups


def test_every_phase_tears_down_with_down_v_after_it_brings_up() -> None:
    assert compose_check.PHASES["insecure-down"] == ["$COMPOSE -f compose.yml down -v"]
    assert compose_check.PHASES["tls-down"] == [f"$COMPOSE {compose_check.TLS_FILES} down -v"]
    runs = [c for cmds in compose_check.PHASES.values() for c in cmds if " operator run /app/project " in c]
    assert len(runs) == 2 and all(f"num-server-rounds={compose_check.ROUNDS}" in r for r in runs)


@pytest.mark.slow
def test_the_results_check_reads_a_real_runs_results_dir(tiny_data, tmp_path) -> None:
    """The script the check runs inside the ServerApp's container, run here on the results dir
    of the same run config in-process (the metrics grew a round-0 row once, and the check, run
    only with Docker, broke on it unseen)."""
    values = {**parse_config_args([compose_check.RUN_CONFIG]), "run-name": "compose-insecure",
              "results-dir": str(tmp_path), "data-dir": tiny_data["fashion-mnist"]}
    cfg = RunConfig.from_flower(values)
    run_federated(InProcessGrid(2, cfg.to_flower()), cfg)
    done = subprocess.run([sys.executable, "-c", compose_check.results_script(str(tmp_path),
                                                                             "compose-insecure")],
                          capture_output=True, text=True, check=True)
    found = json.loads(done.stdout)
    # native: FedACT's CPU loops, built here with this machine's compiler as the image's zig cc does
    assert found["rows"] == [[r, 2, 2, "native"] for r in range(1, compose_check.ROUNDS + 1)]
    assert found["model"] > 0
    assert compose_check.judge_results("compose-insecure", found).endswith("step-path native")


def test_the_check_fails_a_run_whose_clientapps_took_the_eager_path() -> None:
    """Flower's images have no C compiler: without deploy/Dockerfile's CC the ClientApps fall back
    to the eager passes, and the check must say so rather than pass."""
    rows = [[r, 2, 2, "native"] for r in range(1, compose_check.ROUNDS + 1)]
    assert "step-path native" in compose_check.judge_results("run", {"rows": rows, "model": 1})
    for path in ("eager", "eager+native", ""):
        with pytest.raises(compose_check.CheckFailed, match="step path"):
            compose_check.judge_results("run", {"rows": [*rows[:-1], [*rows[-1][:3], path]], "model": 1})
    with pytest.raises(compose_check.CheckFailed, match="rounds"):
        compose_check.judge_results("run", {"rows": rows[:-1], "model": 1})


def test_it_refuses_to_start_with_less_free_disk_than_its_measured_peak(monkeypatch, tmp_path) -> None:
    assert compose_check.MIN_FREE_GB >= 13.5 + 2  # the peak measured by a full run from scratch, + margin
    monkeypatch.setattr(compose_check, "free_gb", lambda path: 15.9)
    started = []
    monkeypatch.setattr(compose_check.dockerd.OwnDockerd, "start", lambda self: started.append(1))
    monkeypatch.setattr(compose_check.dockerd, "why_not_here", lambda: None)
    with pytest.raises(compose_check.Unavailable, match="only 15.9 GB free .* it needs 16 GB"):
        compose_check.run_check(tmp_path)
    assert not started  # nothing was started or built


def _main(monkeypatch, *argv: str) -> None:
    monkeypatch.setattr(sys, "argv", ["compose_check", *argv])
    compose_check.main()


@pytest.mark.parametrize("problem", ["not root (dockerd and apt-get need root)",
                                     "no dockerd binary (Debian's docker.io)",
                                     "only 3.0 GB free on /var/lib; it needs 16 GB"])
def test_ci_skips_with_one_line_where_the_machine_cannot_run_it(monkeypatch, capsys, problem) -> None:
    """.ci/run's `--if-possible`: a machine without root, dockerd or disk says so and exits 0;
    run by hand, the same is exit 2."""
    monkeypatch.setattr(compose_check, "machine_problem", lambda: problem)
    monkeypatch.setattr(compose_check.dockerd.OwnDockerd, "start", lambda self: pytest.fail("started"))
    _main(monkeypatch, "--if-possible")
    assert capsys.readouterr().out == f"compose-check skipped: {problem}\n"
    with pytest.raises(SystemExit) as stopped:
        _main(monkeypatch)
    assert stopped.value.code == 2 and problem in capsys.readouterr().err


def test_a_daemon_that_cannot_start_is_a_skip_and_a_failing_demo_a_failure(monkeypatch, capsys) -> None:
    monkeypatch.setattr(compose_check, "machine_problem", lambda: None)
    stopped = []
    monkeypatch.setattr(compose_check.dockerd.OwnDockerd, "stop", lambda self: stopped.append(1))

    def no_daemon(self) -> str:
        raise TimeoutError("dockerd did not answer within 60 s; see dockerd.log")
    monkeypatch.setattr(compose_check.dockerd.OwnDockerd, "start", no_daemon)
    _main(monkeypatch, "--if-possible")
    assert capsys.readouterr().out == ("compose-check skipped: cannot start a Docker daemon: dockerd "
                                       "did not answer within 60 s; see dockerd.log\n")
    assert stopped == [1]

    monkeypatch.setattr(compose_check.dockerd.OwnDockerd, "start", lambda self: "started dockerd")
    monkeypatch.setattr(compose_check.dockerd, "network_problem", lambda: "cannot create a network")
    _main(monkeypatch, "--if-possible")
    assert capsys.readouterr().out.endswith("skipped: cannot create a network\n")

    def fails(workdir) -> str:
        raise compose_check.CheckFailed("phase images failed (1)")
    monkeypatch.setattr(compose_check, "run_check", fails)
    with pytest.raises(SystemExit) as failed:
        _main(monkeypatch, "--if-possible")
    assert failed.value.code == 1 and "compose-check FAILED: phase images failed" in capsys.readouterr().err


def test_the_machine_checks_name_root_and_the_dockerd_binary(monkeypatch, tmp_path) -> None:
    monkeypatch.setattr(compose_check.dockerd.os, "geteuid", lambda: 1000)
    assert compose_check.dockerd.why_not_here() == "not root (dockerd and apt-get need root)"
    monkeypatch.setattr(compose_check.dockerd.os, "geteuid", lambda: 0)
    monkeypatch.setattr(compose_check.dockerd, "DOCKERD", str(tmp_path / "dockerd"))
    assert compose_check.dockerd.why_not_here() == "no dockerd binary (Debian's docker.io)"


@pytest.mark.parametrize("status,expected", [(200, True), (404, False), (None, False)])
def test_the_host_probe_counts_only_an_answer_of_the_superlinks_own(status, expected) -> None:
    """compose-check's probe of the SuperLink's port from the host (issue 21 §5): a 200 on
    /health is the SuperLink; a gateway that accepts every connection (this machine's answers
    404/426) or nothing listening is not."""
    import http.server
    import threading

    class Health(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            self.send_response(status if self.path == "/health" else 500)
            self.end_headers()

        def log_message(self, *args) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Health)
    port = server.server_address[1]
    if status is None:
        server.server_close()  # nothing listens there any more
        assert compose_check.superlink_answers("127.0.0.1", port) is expected
        return
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        assert compose_check.superlink_answers("127.0.0.1", port) is expected
    finally:
        server.shutdown()
        server.server_close()


def _docker_can_run() -> str:
    """Why not, or '' when it can: root, Debian's apt (to install the engine), a kernel that
    lets dockerd start (checked by the script itself), and the user opted in."""
    if os.environ.get("ADAPTFL_CI_DOCKER") != "1":
        return "opt-in: set ADAPTFL_CI_DOCKER=1 (needs 16 GB of disk and ~10 minutes)"
    if os.geteuid() != 0:
        return "needs root (dockerd, apt-get)"
    if shutil.which("apt-get") is None and shutil.which("dockerd") is None:
        return "neither dockerd nor apt-get to install it"
    return ""


@pytest.mark.docker
@pytest.mark.skipif(bool(_docker_can_run()), reason=_docker_can_run() or "runs")
def test_the_compose_demo_runs_both_variants_end_to_end() -> None:
    done = subprocess.run(["bash", str(ROOT / "deploy" / "compose-check.sh")], capture_output=True,
                          text=True, timeout=3600, check=False)
    assert done.returncode == 0, (done.stdout + done.stderr)[-5000:]
    summary = done.stdout.strip().splitlines()[-1]
    assert summary.startswith("compose-check OK")
    assert summary.count("rounds [(1, 2, 2), (2, 2, 2)], step-path native") == 2, summary
