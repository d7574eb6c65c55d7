"""What a run computes: its settings (settings.py), the components with a part on
each side of the wire (components/), named algorithms (catalog.py), the typed run config
(config.py), the recipe (recipe.py); the declarations they build on are in adaptfl/core/."""
