# The container image (scripts/build-image, the Dockerfile) in real podman containers: who it
# runs as, its config against the Dockerfile's, zstalk serve under a read-only root answering a
# real beanstalk client from inside a network namespace made here, a clean stop on SIGTERM, and
# nothing to build or install with left inside. Needs root, podman, buildah and mmdebstrap
# (scripts/test installs them); skipped without them, failed when CI=true.
from __future__ import annotations

import contextlib
import importlib.machinery
import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import pytest

from image import BUILD_IMAGE, container_image, podman_args  # noqa: F401 (a fixture)
from netns import Lan
from servers import wait_for
from zstalk.broker import VERSION

ROOT = Path(__file__).resolve().parents[2]
# what k8s gives every zstalk pod: a read-only root, an emptyDir at /tmp, no capabilities
LOCKED_DOWN = ["--read-only", "--read-only-tmpfs=false", "--tmpfs", "/tmp",
               "--cap-drop", "all", "--security-opt", "no-new-privileges"]


def build_image_module():
    """scripts/build-image as a module (its Dockerfile parser)."""
    loader = importlib.machinery.SourceFileLoader("build_image", str(BUILD_IMAGE))
    module = importlib.util.module_from_spec(importlib.util.spec_from_loader(loader.name, loader))
    loader.exec_module(module)
    return module


def podman(*argv: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(["podman", *argv], capture_output=True, text=True, timeout=timeout)


def python_in(image: str, code: str, *flags: str) -> str:
    """What `python -c CODE` prints in a fresh container of the image (as its user)."""
    result = podman("run", "--rm", *podman_args(), *flags, "--entrypoint",
                    "/opt/zstalk/bin/python", image, "-c", code)
    assert result.returncode == 0, result.stderr
    return result.stdout


@contextlib.contextmanager
def container(image: str, *argv: str, flags: tuple[str, ...] = ()) -> Iterator[str]:
    """A detached container running the image with argv, removed at the end."""
    name = f"zs-image-test-{os.getpid()}-{time.monotonic_ns()}"
    started = podman("run", "-d", "--name", name, *podman_args(), *flags, image, *argv)
    assert started.returncode == 0, started.stderr
    try:
        yield name
    finally:
        podman("rm", "-f", "-t", "0", name)


def logs(name: str) -> str:
    result = podman("logs", name)
    return result.stdout + result.stderr


CLIENT = """
import json, sys, greenstalk
with greenstalk.Client(("127.0.0.1", int(sys.argv[1])), use="images") as client:
    client.watch("images")
    put = client.put(b"hello from the host")
    job = client.reserve(timeout=5)
    client.delete(job)
    print(json.dumps({"put": put, "reserved": job.id, "body": job.body}))
"""


def test_the_image_runs_zstalk_as_uid_10001_in_an_empty_app_directory(container_image):
    version = podman("run", "--rm", *podman_args(), container_image, "--version")
    assert version.stdout.strip() == f"zstalk, version {VERSION}"
    seen = json.loads(python_in(container_image, "import json, os; print(json.dumps("
                                "[os.getuid(), os.getgid(), os.getcwd(), os.listdir('.')]))"))
    assert seen == [10001, 10001, "/app", []]


def test_the_image_config_is_the_dockerfiles(container_image):
    inspected = json.loads(podman("image", "inspect", container_image).stdout)[0]["Config"]
    dockerfile = build_image_module().image_config((ROOT / "Dockerfile").read_text(), {})
    assert inspected["User"] == dockerfile["user"] == "10001:10001"
    assert inspected["WorkingDir"] == dockerfile["workdir"] == "/app"
    assert inspected["Entrypoint"] == dockerfile["entrypoint"] == ["/opt/zstalk/bin/zstalk"]
    assert inspected["Cmd"] == dockerfile["cmd"]
    assert sorted(inspected["Env"]) == sorted(f"{k}={v}" for k, v in dockerfile["env"].items())
    labels = inspected["Labels"]
    built_with = {"org.opencontainers.image.revision", "org.opencontainers.image.source"}
    assert {k: v for k, v in labels.items() if k in dockerfile["labels"] and k not in built_with} \
        == {k: v for k, v in dockerfile["labels"].items() if k not in built_with}
    assert labels["org.opencontainers.image.version"] == VERSION
    assert labels["org.opencontainers.image.title"] == "zstalk"
    assert labels["org.opencontainers.image.licenses"] == "MIT"
    installed = podman("run", "--rm", *podman_args(), "--entrypoint", "dpkg-query", container_image,
                       "-W", "-f", "${Package} ", *dockerfile["packages"])
    assert sorted(installed.stdout.split()) == sorted(dockerfile["packages"]), installed.stderr


def test_build_image_without_its_tools_names_them_and_their_debian_packages(tmp_path):
    # PATH holds no command at all: the script runs, and says what it needs
    done = subprocess.run([sys.executable, str(BUILD_IMAGE)], capture_output=True, text=True,
                          env={"PATH": str(tmp_path)}, timeout=60)
    assert done.returncode == 1
    assert done.stderr.strip() == (
        "build-image: needs mmdebstrap (Debian package mmdebstrap), buildah (Debian package "
        "buildah), git (Debian package git); install them with apt-get install mmdebstrap "
        "buildah git (and run as root)")


def test_the_dockerfile_names_zstalks_version_for_docker_builds():
    config = build_image_module().image_config((ROOT / "Dockerfile").read_text(), {})
    assert config["labels"]["org.opencontainers.image.version"] == VERSION


def test_serve_under_a_read_only_root_answers_a_beanstalk_client_and_stops_on_sigterm(
        container_image):
    port = 11300
    with Lan(f"zsimg{os.getpid()}") as lan:
        host = lan.host("image")
        # --fronts 1: the broker and its front are processes talking over ipc:// in /tmp
        with container(container_image, "serve", "-l", "127.0.0.1", "-p", str(port),
                       "--counter-port", "0", "--worker-bind", "none", "--fronts", "1",
                       flags=(*LOCKED_DOWN, "--network", f"ns:{host.path}")) as name:
            assert wait_for(lambda: f"beanstalk on 127.0.0.1:{port}" in logs(name), 30), logs(name)
            client = host.exec([sys.executable, "-c", CLIENT, str(port)], timeout=60)
            assert client.returncode == 0, client.stderr + logs(name)
            answered = json.loads(client.stdout)
            assert answered["reserved"] == answered["put"]
            assert answered["body"] == "hello from the host"
            began = time.monotonic()
            assert podman("stop", "-t", "20", name).returncode == 0
            assert time.monotonic() - began < 15
            exit_code = podman("inspect", "--format", "{{.State.ExitCode}}", name).stdout
            assert exit_code.strip() == "0", logs(name)


def test_the_image_holds_no_pip_compilers_apt_lists_or_uncompiled_modules(container_image):
    found = json.loads(python_in(container_image, """
import importlib.util, json, os, pathlib, shutil
tools = [t for t in ("pip", "pip3", "gcc", "cc", "make") if shutil.which(t)]
uncompiled = [str(p) for p in pathlib.Path("/opt/zstalk/lib").rglob("*.py")
              if not os.path.exists(importlib.util.cache_from_source(str(p)))]
lists = os.listdir("/var/lib/apt/lists") if os.path.isdir("/var/lib/apt/lists") else []
print(json.dumps([tools, importlib.util.find_spec("pip") is None, uncompiled,
                  [f for f in lists if f not in ("partial", "lock", "auxfiles")]]))
""", *LOCKED_DOWN))
    assert found == [[], True, [], []]


def test_the_images_size_is_reported(container_image, capsys):
    size = int(podman("image", "inspect", "--format", "{{.Size}}", container_image).stdout)
    with capsys.disabled():
        print(f"\n{container_image}: {size / 1e6:.0f} MB", file=sys.stderr)
    assert size < 400e6     # Debian's python3 and zstalk's wheels are about 140 MB
