"""The local update: one torch optimizer shell (shell.py) over the preconditioner rules
(rules/), the trust modulation (modulation.py, trust.py, topk.py) and Θ on the wire (theta.py)."""

from adaptfl.local_update.shell import LocalUpdate

__all__ = ["LocalUpdate"]
