# pykcm container: a virtual environment made in a build stage; the final image is the base Python
# image plus that environment alone (no wheels, no pip, no build tools), run as a non-root user
# with a read-only root filesystem.
#
# BASE_IMAGE   the Python image pykcm runs on: the official slim one, or a mirror's copy of it.
# BUILD_IMAGE  the build stage's image (default: BASE_IMAGE). It must have the same Python at the
#              same path; point it at BASE_IMAGE plus a CA bundle or pip configuration when pip
#              must go through a proxy or a package mirror. Nothing of it reaches the final image.
ARG BASE_IMAGE=python:3.11-slim-bookworm
ARG BUILD_IMAGE=${BASE_IMAGE}

FROM ${BUILD_IMAGE} AS build
SHELL ["/bin/sh", "-eux", "-c"]
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    DEBIAN_FRONTEND=noninteractive
# strip, for the compiled extension modules below; build stage only.
# hadolint ignore=DL3008
RUN apt-get update; \
    apt-get install -y --no-install-recommends binutils; \
    rm -rf /var/lib/apt/lists/*; \
    python3 -m venv /opt/pykcm
WORKDIR /src
# The dependencies first, read from pyproject.toml alone: a source change reuses this layer.
COPY pyproject.toml ./
RUN python3 -c 'import tomllib; print("\n".join(tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]))' \
        > requirements.txt; \
    /opt/pykcm/bin/pip install --no-cache-dir --no-compile -r requirements.txt "setuptools>=68" "wheel>=0.40"
COPY README.md ./
COPY pykcm ./pykcm
COPY controllers ./controllers
# Install pykcm, then drop what only installing needed, the `kubernetes` package's asyncio client
# (pykcm uses only its sync config loaders, which never import it) and the extensions' symbols.
# Bytecode is compiled ahead (the root filesystem is read-only, so a start would compile all it
# imports, twice as slow), except for `kubernetes`' generated API and models, which pykcm never
# imports (30 MB of bytecode).
RUN /opt/pykcm/bin/pip install --no-cache-dir --no-compile --no-deps --no-build-isolation .; \
    /opt/pykcm/bin/pip uninstall -y pip setuptools wheel; \
    site=$(/opt/pykcm/bin/python -c 'import sysconfig; print(sysconfig.get_path("purelib"))'); \
    rm -rf "$site/kubernetes/aio"; \
    find /opt/pykcm -name '*.so' -exec strip --strip-unneeded {} +; \
    find /opt/pykcm -name __pycache__ -prune -exec rm -rf {} +; \
    /opt/pykcm/bin/python -m compileall -q -j 0 --invalidation-mode unchecked-hash \
        -x '/kubernetes/client/(api|models)/' /opt/pykcm; \
    /opt/pykcm/bin/pykcm controllers

FROM ${BASE_IMAGE}
ARG VERSION=0.1.0
LABEL org.opencontainers.image.title="pykcm" \
      org.opencontainers.image.description="A standalone kube-controller-manager in Python" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.source="https://github.com/pykcm/pykcm"
ENV PATH=/opt/pykcm/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
COPY --from=build /opt/pykcm /opt/pykcm
# 65532 is the conventional "nonroot" UID; numeric so runAsNonRoot can verify it.
USER 65532:65532
# --secure-port's default, as KCM's; deploy/ passes 10357, beside KCM's 10257 on the host network.
EXPOSE 10257
ENTRYPOINT ["pykcm"]
CMD ["run"]
