"""Where the deployment kit's files lie in a source checkout.

The top-level `deploy/` is a folder of its own (not a link into this package): it holds what
Docker and the operators read (the compose files, the Dockerfiles, generate-certs.sh, the
host-built wheelhouse and certs/), so the compose files' `context: ..` is the repository root
whichever path compose is run from; docker-compose v1 resolves a link to its real folder, v2
keeps the path it was given (docs/deployment.md). The Python tools are this package.
tests/deploy/test_deploy_paths.py resolves every path named here and in the compose files.
"""

from __future__ import annotations

from pathlib import Path

from adaptfl import source as where

# adaptfl's source checkout: the kit builds images from its tree and `flwr run`s its pyproject.toml.
# An installed wheel has neither; its entry points then stop in one line (adaptfl/source.py: checkout).
PROJECT = where.source_checkout() or Path(__file__).resolve().parents[2]
DEPLOY = PROJECT / "deploy"  # the compose demo's commands run here (`cd deploy`)
GENERATE_CERTS = DEPLOY / "generate-certs.sh"  # the loopback kit's and the compose demo's keys
STAND_IN_DOCKERFILE = DEPLOY / "flower-stand-in.Dockerfile"
WHEELHOUSE = DEPLOY / "wheelhouse"  # `python -m adaptfl.deploy.wheelhouse wheelhouse` in deploy/
CERTS = DEPLOY / "certs"  # `./generate-certs.sh certs N` in deploy/ (with-tls.yml mounts ./certs/*)
