"""The declarations everything else builds on, importing nothing else of adaptfl: hyperparameters
and the component registry (params.py), value domains (domain.py), the wire's record names
(wire.py) and contract (contract.py), a local step's inputs (stage.py), exit codes, durable
writes, and the privacy and secure-aggregation settings components."""
