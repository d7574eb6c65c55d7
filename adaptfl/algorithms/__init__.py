"""What a run computes: hyperparameters declared once (params.py), the components with a part on
each side of the wire (components/), named algorithms (catalog.py), the typed run config
(config.py), the recipe and the wire contract (recipe.py, contract.py, wire.py)."""
