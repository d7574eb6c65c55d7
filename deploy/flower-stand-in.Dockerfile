# Stand-ins for Flower's official images, built only where Docker Hub cannot be reached
# (adaptfl/deploy/compose_check.py says when it does so). They mirror Flower's own Dockerfiles
# (framework/docker/base/ubuntu, superlink, supernode, superexec): a virtual environment at
# /python/venv holding flwr, the non-root user `app` (uid 49999) with HOME=/app, and the
# entrypoints flower-superlink / flower-supernode / flower-superexec. What differs: the base is
# a Debian 12 root filesystem made by debootstrap (its Python 3.11 stands in for Flower's
# py3.11 build), and flwr comes from the host-built wheelhouse, so the build dials nothing.
#   docker build -f deploy/flower-stand-in.Dockerfile --target superlink -t flwr/superlink:TAG .
ARG ROOTFS_IMAGE=adaptfl-stand-in/debian:bookworm-minbase
FROM ${ROOTFS_IMAGE} AS base
ARG WHEELHOUSE=deploy/wheelhouse
ARG FLWR_VERSION=1.42.0
RUN python3 -m venv /python/venv \
 && useradd --no-create-home --home-dir /app -c "" --uid 49999 app \
 && mkdir -p /app && chown -R app:app /app
RUN --mount=type=bind,target=/tmp/context \
    /python/venv/bin/pip install --no-cache-dir --no-index --find-links "/tmp/context/${WHEELHOUSE}" \
        "flwr==${FLWR_VERSION}" \
 && chown -R app:app /python/venv
ENV PATH=/python/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONIOENCODING=UTF-8 \
    LANG=C.UTF-8 \
    LC_ALL=C.UTF-8
LABEL org.adaptfl.stand-in="debootstrap bookworm + flwr from the wheelhouse, not Flower's image"
WORKDIR /app
USER app
ENV HOME=/app

FROM base AS superlink
ENTRYPOINT ["flower-superlink"]

FROM base AS supernode
ENTRYPOINT ["flower-supernode"]

FROM base AS superexec
ENTRYPOINT ["flower-superexec"]
