"""What a run computes: the typed run config, the algorithm presets and the wire keys."""
