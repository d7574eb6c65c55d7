"""User-level differential privacy over everything a client shares (docs/privacy.md):
`settings.py` declares the dp keys, `mechanism.py` clips and noises, `accountant.py` counts ε,
`ledger.py` adds it up over the runs on one data set, `server.py` is the strategy's side of a
round, `checks.py` what composes with dp, `release.py` what a dp run's shared outputs may hold,
`audit.py` (with `audit_bound.py`) an empirical lower bound on ε from one run with canaries."""
