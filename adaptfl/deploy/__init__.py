"""Deployment kit: commands shared by the compose demo and the loopback script."""
