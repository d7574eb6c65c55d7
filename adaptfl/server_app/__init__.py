"""The ServerApp: config at the edge, the round loop, central evaluation and outputs."""
