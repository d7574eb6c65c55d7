"""The generic ClientApp: it runs whatever recipe the server's message describes."""
