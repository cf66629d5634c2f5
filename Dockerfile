# syntax=docker/dockerfile:1
# pykcm container: the wheel only, on a slim official Python base, as a non-root user.

FROM python:3.11-slim-bookworm AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY pykcm ./pykcm
COPY controllers ./controllers
RUN pip wheel --no-cache-dir --wheel-dir /wheels .

FROM python:3.11-slim-bookworm
ARG VERSION=0.1.0
LABEL org.opencontainers.image.title="pykcm" \
      org.opencontainers.image.description="A standalone kube-controller-manager in Python" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.source="https://github.com/pykcm/pykcm"
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir --no-compile /wheels/*.whl && rm -rf /wheels
# 65532 is the conventional "nonroot" UID; numeric so runAsNonRoot can verify it.
USER 65532:65532
EXPOSE 10257
ENTRYPOINT ["pykcm"]
CMD ["run"]
