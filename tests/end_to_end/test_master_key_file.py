"""The master key from a file (--master-key-file / ZSTALK_MASTER_KEY_FILE, a mounted
Kubernetes Secret), read by protocol/network/secret.py as the signing key's file is: real `zstalk
serve` and `zstalk front http` processes on 127.0.0.1, and the reader on its own."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from servers import find_zstalk, free_port, self_check
from test_tasks_end_to_end import Api, host, serve  # noqa: F401 (fixtures)
from test_tasks_supervised import child, enqueue_and_finish
from zstalk.protocol.network.secret import SecretError, read_secret_file


# -- the reader -----------------------------------------------------------------------------
@pytest.mark.parametrize("written, read", [(b"k3y\n", b"k3y"), (b"k3y\r\n", b"k3y"),
                                           (b"k3y", b"k3y"), (b" k3y \n\n", b" k3y \n")])
def test_a_secret_file_is_read_less_one_trailing_newline(tmp_path, written, read):
    path = tmp_path / "secret"
    path.write_bytes(written)
    assert read_secret_file(str(path), "--x-file") == read


def test_an_empty_or_unreadable_secret_file_is_an_error_naming_the_option_and_the_path(
        tmp_path):
    path = tmp_path / "secret"
    path.write_bytes(b"\n")
    with pytest.raises(SecretError, match=f"--x-file names {path}, which is empty"):
        read_secret_file(str(path), "--x-file")
    with pytest.raises(SecretError, match=f"--x-file names {tmp_path}/nosuch, which cannot "
                                          "be read: No such file"):
        read_secret_file(str(tmp_path / "nosuch"), "--x-file")


# -- real processes -------------------------------------------------------------------------
needs_zstalk = pytest.mark.skipif(self_check(), reason="needs zstalk")


def key_file(tmp_path: Path, text: str = "s3cret\n") -> Path:
    path = tmp_path / "master-key"
    path.write_text(text)
    path.chmod(0o400)
    return path


def front_http(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([find_zstalk(), "front", "http", "--listen",
                           f"127.0.0.1:{free_port()}", *args],
                          capture_output=True, text=True, timeout=30,
                          env={**os.environ, **(env or {})})


@needs_zstalk
def test_serve_takes_the_master_key_from_the_file_its_option_names(serve, host, tmp_path):
    api = serve("--master-key-file", str(key_file(tmp_path)))
    assert api.request("POST", "/v1/tasks", {"function": "f"})[0] == 401
    api.key = "s3cret"
    assert enqueue_and_finish(api, "keyed", None)["status"] == "success"


@needs_zstalk
def test_a_supervised_http_front_is_given_the_key_files_name_not_the_key(serve, host,
                                                                         tmp_path):
    path = key_file(tmp_path)
    api = serve("--fronts", "1", env={**os.environ, "ZSTALK_MASTER_KEY_FILE": str(path)})
    api.key = "s3cret"
    assert enqueue_and_finish(api, "keyed", None)["status"] == "success"
    front = child(api.server.pid, "front", "http")
    environ = Path(f"/proc/{front}/environ").read_bytes()
    assert f"ZSTALK_MASTER_KEY_FILE={path}".encode() in environ
    assert b"s3cret" not in environ + Path(f"/proc/{front}/cmdline").read_bytes()
    for other in (child(api.server.pid, "broker"), child(api.server.pid, "dispatcher")):
        assert b"ZSTALK_MASTER_KEY" not in Path(f"/proc/{other}/environ").read_bytes()


@needs_zstalk
@pytest.mark.parametrize("given, env", [
    (["--master-key", "k", "--master-key-file", "/dev/null"], {}),
    (["--master-key", "k"], {"ZSTALK_MASTER_KEY_FILE": "/dev/null"}),
    ([], {"ZSTALK_MASTER_KEY": "k", "ZSTALK_MASTER_KEY_FILE": "/dev/null"})])
def test_the_master_key_and_its_file_together_are_a_usage_error(given, env):
    out = front_http(*given, env=env)
    assert out.returncode == 2 and "Usage:" in out.stderr
    assert "give --master-key (ZSTALK_MASTER_KEY) or --master-key-file " \
           "(ZSTALK_MASTER_KEY_FILE), not both" in out.stderr


@needs_zstalk
def test_an_empty_master_key_file_stops_the_start_with_exit_2_naming_it(tmp_path):
    path = key_file(tmp_path, "\n")
    out = front_http("--master-key-file", str(path))
    assert out.returncode == 2
    assert out.stderr.strip() == \
        f"zstalk: --master-key-file (ZSTALK_MASTER_KEY_FILE) names {path}, which is empty"
    out = subprocess.run([find_zstalk(), "serve", "-p", "0", "--master-key-file",
                          str(tmp_path / "nosuch")], capture_output=True, text=True, timeout=30)
    assert out.returncode == 2 and f"{tmp_path}/nosuch, which cannot be read" in out.stderr
