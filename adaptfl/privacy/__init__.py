"""User-level differential privacy over everything a client shares (docs/privacy.md):
`settings.py` declares the dp keys, `mechanism.py` clips and noises, `accountant.py` counts ε,
`server.py` is the strategy's side of a round, `checks.py` what composes with dp."""
