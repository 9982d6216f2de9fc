# One image for both processes: `ix-gpu webhook` (Deployment, non-root) and `ix-gpu plugin`
# (DaemonSet, privileged by its pod spec). Every dependency ships wheels; the build stage has a C
# compiler only for the webhook's request path, which mypyc compiles from the same typed sources
# (setup.py). The image the stage hands on has no compiler, pip or mypy.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/*
RUN python -m venv /opt/ix-gpu
ENV PATH=/opt/ix-gpu/bin:$PATH
WORKDIR /src
COPY pyproject.toml setup.py README.md constraints.txt ./
COPY ix_gpu ./ix_gpu
# The same constraints file CI installs with (scripts/test.sh), without the dev extras: first the
# package and its dependencies, then the package again, compiled. mypyc type-checks what it compiles
# against the dependencies, so it builds without isolation once they are installed; mypy and
# setuptools (and the stubs mypy checks with) come from a folder outside the venv, which the final
# stage does not copy.
RUN python -m pip install --no-compile -c constraints.txt . \
    && python -m pip install --no-compile --target /opt/build-tools -c constraints.txt mypy types-PyYAML setuptools \
    && IX_GPU_COMPILE=1 PYTHONPATH=/opt/build-tools python -m pip install --no-compile --no-build-isolation \
        --no-deps --force-reinstall -c constraints.txt .
# Fail the build, not the rollout, when the webhook's request path is not native (from /, so that
# the installed package is imported, not /src).
RUN cd / && python -c 'import ix_gpu.webhook.core.mutation as m, sys; sys.exit(0 if m.__file__.endswith(".so") else m.__file__)'
# Nothing installs packages at run time: pip and setuptools leave the venv the image ships.
RUN python -m pip uninstall --quiet --yes pip setuptools
# Bytecode that does not depend on file times. pip's default pyc files record each source's mtime,
# and an image export or layer copy that rounds mtimes to whole seconds leaves most of them stale:
# every process then recompiles at start, which took `kubernetes/client/api/core_v1_api.py` alone
# from 47 MiB to a 142 MiB peak and got the 128 MiB `helm test` pod OOM-killed. The image is
# immutable, so the sources are never checked again.
RUN python -m compileall -q -j 0 --invalidation-mode unchecked-hash /opt/ix-gpu/lib
# Fail the build, not the rollout, when the console script does not resolve.
RUN ix-gpu --help >/dev/null && ix-gpu webhook --help >/dev/null && ix-gpu plugin --help >/dev/null

FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="ix-gpu" \
      org.opencontainers.image.description="GPU admission webhook and device plugin for Kubernetes" \
      org.opencontainers.image.licenses="Apache-2.0"
RUN groupadd --system --gid 10001 ix-gpu \
    && useradd --system --uid 10001 --gid 10001 --no-create-home --shell /usr/sbin/nologin ix-gpu
COPY --from=build /opt/ix-gpu /opt/ix-gpu
ENV PATH=/opt/ix-gpu/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
# Numeric, so the kubelet can check runAsNonRoot without reading /etc/passwd. The plugin's
# DaemonSet overrides this with a privileged securityContext, as device access requires.
USER 10001:10001
ENTRYPOINT ["ix-gpu"]
CMD ["--help"]
