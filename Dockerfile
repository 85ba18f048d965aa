# syntax=docker/dockerfile:1
# The HybridServing operator image: `python -m hybridserving.controller` on a slim Python,
# as the non-root UID 65532, with nothing but the installed package and its dependencies.
#   docker build -t hybridserving/operator:0.1.0 .

# Both stages use the same base so that the virtual environment's interpreter link is valid.
ARG PYTHON_IMAGE=python:3.11.13-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY operator/ operator/
COPY engine/ engine/
RUN python -m venv /opt/hybridserving
ENV PATH=/opt/hybridserving/bin:$PATH
# A non-editable install: the final stage gets the package, not the source tree.
RUN pip install --no-cache-dir "./[operator]"

FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="hybridserving-operator" \
      org.opencontainers.image.description="Kubernetes operator for prefill/decode-disaggregated SGLang fleets" \
      org.opencontainers.image.version="0.1.0" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build /opt/hybridserving /opt/hybridserving
ENV PATH=/opt/hybridserving/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
# The chart runs the pod with a read-only root filesystem; /tmp is its only writable mount.
WORKDIR /tmp
USER 65532:65532
ENTRYPOINT ["python", "-m", "hybridserving.controller"]
