# label-rbac webhook image.
#
# Two stages. The build stage installs the locked requirements into a virtual environment with
# Debian 12's Python 3.11, the interpreter of the runtime image, so binary wheels match: every
# dependency, transitive ones included, pinned with the hashes of its files (requirements.lock,
# --require-hashes: a file that does not match is refused); only wheels are accepted
# (--only-binary), so nothing is compiled and no compiler is installed.
# The runtime stage is distroless: Python and its libraries, no shell, no package manager, no
# pip (removed from the environment before it is copied), running as uid 65532.
#
# Both bases are pinned by digest (the index digests of debian:12-slim and
# gcr.io/distroless/python3-debian12:nonroot). To move to newer ones, take the digest from
# `docker buildx imagetools inspect <image:tag>` and rebuild.
FROM debian:12-slim@sha256:1371f816c47921a144436ca5a420122a30de85f95401752fd464d9d4e1e08271 AS build
RUN apt-get update \
    && apt-get install --no-install-recommends --yes python3-venv \
    && rm -rf /var/lib/apt/lists/*
RUN python3 -m venv /opt/label-rbac
COPY requirements.lock /tmp/requirements.lock
RUN /opt/label-rbac/bin/pip install --no-cache-dir --disable-pip-version-check \
        --require-hashes --no-deps --only-binary=:all: -r /tmp/requirements.lock \
    && /opt/label-rbac/bin/pip uninstall --yes --disable-pip-version-check pip setuptools \
    && rm -f /opt/label-rbac/bin/activate* /opt/label-rbac/bin/Activate.ps1
COPY app /opt/label-rbac/app
RUN /opt/label-rbac/bin/python -m compileall -q /opt/label-rbac

FROM gcr.io/distroless/python3-debian12:nonroot@sha256:498e3cb48826d99bad1301994da60caa126b25c0ce03dc4e6a47a7c10fe02493
# OCI annotations (https://github.com/opencontainers/image-spec/blob/main/annotations.md); set
# version and revision at build time: --build-arg VERSION=0.3.8 --build-arg REVISION=$(git rev-parse HEAD).
ARG VERSION=0.3.8
ARG REVISION=unknown
LABEL org.opencontainers.image.title="label-rbac" \
      org.opencontainers.image.description="Label-based permissions for Kubernetes: admission webhook and policy compiler" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.base.name="gcr.io/distroless/python3-debian12:nonroot" \
      org.opencontainers.image.base.digest="sha256:498e3cb48826d99bad1301994da60caa126b25c0ce03dc4e6a47a7c10fe02493"
COPY --from=build /opt/label-rbac /opt/label-rbac
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
WORKDIR /opt/label-rbac
USER 65532:65532
EXPOSE 8443
ENTRYPOINT ["/opt/label-rbac/bin/python", "-m", "app"]
# In a cluster: the RBAC of the cluster (in-cluster service account), the serving certificate
# from the Secret volume at /tls (manifests/deploy), 10 s of drain on SIGTERM.
CMD ["serve", "--tls-cert=/tls/tls.crt", "--tls-key=/tls/tls.key", "--drain-seconds=10"]
