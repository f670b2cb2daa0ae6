"""zstalk's container image for tests that run it in podman.

    from image import container_image, podman_args   # container_image is a session fixture
    def test_x(container_image):
        subprocess.run(["podman", "run", "--rm", *podman_args(), container_image, "--version"])

`zstalk_image()` runs scripts/build-image once per session (about 30-40 s cold; a second or so
when the image for these sources exists) and returns its reference; ZSTALK_TEST_IMAGE=REF
tests REF instead (e.g. an image built from the Dockerfile). `podman_args()` are the
`podman run` flags this machine needs: runc where installed (crun cannot run containers on a
host with hybrid cgroups) and ulimits below the host's, since podman's defaults raise them
and a sandbox without CAP_SYS_RESOURCE refuses that; lower limits are harmless elsewhere.
Without root, podman, buildah or mmdebstrap (scripts/test's image group), or with
ZSTALK_TEST_SKIP=image, the fixture skips, and fails when CI=true, as a missing reference
server does.
"""
from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from servers import group_missing, group_skipped, unavailable

BUILD_IMAGE = Path(__file__).resolve().parents[2] / "scripts" / "build-image"
TOOLS = ("podman", "buildah", "mmdebstrap")


def image_missing() -> str | None:
    """Why the image cannot be built and run here, or None."""
    if os.geteuid() != 0 and not group_skipped("image"):
        return "building and running the image needs root"
    return group_missing("image", TOOLS)


def require_image() -> None:
    """Skip without the tools, or fail on CI."""
    why = image_missing()
    if why is not None:
        unavailable(why)


@functools.cache
def zstalk_image() -> str:
    """$ZSTALK_TEST_IMAGE, else what scripts/build-image prints last (built only if changed)."""
    if os.environ.get("ZSTALK_TEST_IMAGE"):
        return os.environ["ZSTALK_TEST_IMAGE"]
    result = subprocess.run([sys.executable, str(BUILD_IMAGE)], capture_output=True, text=True,
                            timeout=900)
    if result.returncode != 0:
        pytest.fail(f"scripts/build-image failed:\n{result.stderr[-4000:]}")
    sys.stderr.write(result.stderr)
    return result.stdout.strip().splitlines()[-1]


def podman_args() -> list[str]:
    """Flags for `podman run` on this machine (see the module comment)."""
    runtime = ["--runtime", "runc"] if shutil.which("runc") else []
    return [*runtime, "--ulimit", "nofile=20000:20000", "--ulimit", "nproc=8192:8192"]


@pytest.fixture(scope="session")
def container_image() -> str:
    require_image()
    return zstalk_image()
