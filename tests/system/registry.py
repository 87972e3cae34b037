"""Debian's `docker-registry` (distribution 2.8) on 127.0.0.1, one per run.

Optionally with htpasswd auth, so a missing or wrong pull secret gives the real 401 chain."""

from __future__ import annotations

import base64
import ctypes
import json
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

from tests.system.machine import die_with_parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def bcrypt(password: str) -> str:
    """An htpasswd bcrypt hash via libxcrypt (the `crypt` module is deprecated; distribution's
    htpasswd accepts only bcrypt)."""
    lib = ctypes.CDLL("libcrypt.so.1")
    lib.crypt_gensalt.restype = ctypes.c_char_p
    lib.crypt_gensalt.argtypes = [ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p, ctypes.c_int]
    lib.crypt.restype = ctypes.c_char_p
    lib.crypt.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
    setting = lib.crypt_gensalt(b"$2b$", 5, None, 0)
    return lib.crypt(password.encode(), setting).decode()


class Registry:
    def __init__(self, workdir: Path, *, user: str | None = None, password: str | None = None):
        self.workdir = workdir
        self.port = free_port()
        self.host = f"127.0.0.1:{self.port}"
        self.user, self.password = user, password
        self.proc: subprocess.Popen | None = None

    def start(self) -> Registry:
        self.workdir.mkdir(parents=True, exist_ok=True)
        auth = ""
        if self.user and self.password:
            hashed = bcrypt(self.password)
            (self.workdir / "htpasswd").write_text(f"{self.user}:{hashed}\n")
            auth = f"auth: {{htpasswd: {{realm: test, path: {self.workdir / 'htpasswd'}}}}}\n"
        config = self.workdir / "config.yml"
        config.write_text(
            "version: 0.1\nlog: {level: warn}\n"
            f"storage: {{filesystem: {{rootdirectory: {self.workdir / 'data'}}}, "
            "delete: {enabled: true}}\n"
            f"http: {{addr: {self.host}}}\n{auth}"
        )
        log = open(self.workdir / "registry.log", "w")  # noqa: SIM115 (lives with the process)
        self.proc = subprocess.Popen(
            ["docker-registry", "serve", str(config)],
            stdout=log,
            stderr=subprocess.STDOUT,
            preexec_fn=die_with_parent,
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                urllib.request.urlopen(f"http://{self.host}/v2/", timeout=1)
                return self
            except urllib.error.HTTPError:
                return self  # 401 from an auth registry: it is up
            except OSError:
                time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"docker-registry did not answer on {self.host}")

    def authfile(self, path: Path) -> Path:
        """A containers-auth.json for this registry (also the shape of a pull secret)."""
        token = base64.b64encode(f"{self.user}:{self.password}".encode()).decode()
        path.write_text(json.dumps({"auths": {self.host: {"auth": token}}}))
        return path

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
