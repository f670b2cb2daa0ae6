"""What a release says of itself agrees: the version `--version` prints
(protocol/schema/version.py), the image's `ARG VERSION` in the Dockerfile (scripts/build-image
passes the same as a build argument), the tag k8s/base gives the image, and the licence."""
from __future__ import annotations

import re
from pathlib import Path

from zstalk.protocol.schema.version import VERSION

ROOT = Path(__file__).resolve().parents[2]


def test_the_dockerfile_builds_the_version_zstalk_prints():
    [arg] = re.findall(r"^ARG VERSION=(\S+)$", (ROOT / "Dockerfile").read_text(), re.M)
    assert arg == VERSION


def test_the_kubernetes_base_runs_the_image_of_this_version():
    [tag] = re.findall(r"^\s+newTag: (\S+)$", (ROOT / "k8s/base/kustomization.yaml").read_text(),
                       re.M)
    assert tag == VERSION


def test_the_licence_is_mit_as_pyproject_and_the_image_say():
    assert (ROOT / "LICENSE").read_text().startswith("MIT License\n")
    assert 'license = { text = "MIT" }' in (ROOT / "pyproject.toml").read_text()
    assert 'org.opencontainers.image.licenses="MIT"' in (ROOT / "Dockerfile").read_text()
