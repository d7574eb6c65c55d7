"""Exit codes of adaptfl's command lines, one per kind of outcome, the same for every program
(`python -m adaptfl.engine`, `scripts/main_job.sh`, `python -m adaptfl.server_app.check_overrides`):

    0  the run completed (or the check passed)
    1  anything else failed: a crash, a Flower run that failed after it started
    2  refused before round 1, with one line `config error: …`: a bad key or value, or a run the
       preflight refuses (the task's data or label column missing, a `module:function` that does
       not import, a model that does not fit the task, a setting no client can run, a run-name
       in use)
    3  aborted after it started, with one line (server_app/abort.py): too many skipped rounds, a
       run no round trained, a non-finite final model

Under a plain `flwr run` Flower owns the exit code; the ServerApp raises and Flower marks the
run failed with the same message.
"""

REFUSED_EXIT_CODE = 2
ABORTED_EXIT_CODE = 3
