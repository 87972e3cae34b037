"""An admin's REST client for an API server on loopback (the kit's real one over TLS, or the
project's fakekube), and the primitives the cluster scenarios build on it: create-or-replace,
a watch as a stream of events, and a follower that rides out expiry and restarts."""

from __future__ import annotations

import asyncio
import base64
import json
import ssl
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp


class AdminClient:
    """Requests as the cluster's admin. A subclass names the server (`url`), the admin's
    bearer token (`admin_token`) and, for TLS, the CA to trust (`ca_file`)."""

    _session: aiohttp.ClientSession | None = None

    @property
    def url(self) -> str:
        raise NotImplementedError

    def admin_token(self) -> str:
        raise NotImplementedError

    def ca_file(self) -> Path | None:
        return None

    def _ssl(self) -> ssl.SSLContext | bool:
        ca = self.ca_file()
        return ssl.create_default_context(cafile=str(ca)) if ca is not None else True

    async def session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                headers={"Authorization": f"Bearer {self.admin_token()}"},
                connector=aiohttp.TCPConnector(ssl=self._ssl()),
                timeout=aiohttp.ClientTimeout(total=30),
            )
        return self._session

    async def close_session(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def request(self, method: str, path: str, body: Any = None, *,
                      content_type: str = "application/json",
                      params: dict[str, str] | None = None) -> tuple[int, Any]:  # fmt: skip
        session = await self.session()
        async with session.request(method, self.url + path, json=body, params=params,
                                   headers={"Content-Type": content_type}) as resp:  # fmt: skip
            return resp.status, await resp.json(content_type=None)

    async def call(self, method: str, path: str, body: Any = None, **kwargs: Any) -> Any:
        status, data = await self.request(method, path, body, **kwargs)
        if not 200 <= status < 300:
            message = data.get("message") if isinstance(data, dict) else data
            raise RuntimeError(f"{method} {path}: {status} {message}")
        return data

    async def get(self, path: str) -> dict[str, Any] | None:
        status, data = await self.request("GET", path)
        if status == 404:
            return None
        if status != 200:
            raise RuntimeError(f"GET {path}: {status} {data}")
        return data

    async def merge_patch(self, path: str, body: dict[str, Any]) -> Any:
        return await self.call("PATCH", path, body, content_type="application/merge-patch+json")

    def write_kubeconfig(self, path: Path, user: str, token: str) -> Path:
        ca_file, ca = self.ca_file(), ""
        if ca_file is not None:
            data = base64.b64encode(ca_file.read_bytes()).decode()
            ca = f"    certificate-authority-data: {data}\n"
        path.write_text(
            "apiVersion: v1\nkind: Config\n"
            f"clusters:\n- name: kit\n  cluster:\n    server: {self.url}\n"
            f"{ca}"
            f"users:\n- name: {user}\n  user:\n    token: {token}\n"
            f"contexts:\n- name: kit\n  context: {{cluster: kit, user: {user}}}\n"
            "current-context: kit\n"
        )
        path.chmod(0o600)
        return path


_PATHS = {
    ("v1", "Node"): "/api/v1/nodes",
    ("v1", "Namespace"): "/api/v1/namespaces",
    ("v1", "ConfigMap"): "/api/v1/namespaces/{namespace}/configmaps",
    ("machineconfiguration.openshift.io/v1", "MachineConfig"):
        "/apis/machineconfiguration.openshift.io/v1/machineconfigs",
    ("machineconfiguration.openshift.io/v1", "ControllerConfig"):
        "/apis/machineconfiguration.openshift.io/v1/controllerconfigs",
    ("machineconfiguration.openshift.io/v1", "KubeletConfig"):
        "/apis/machineconfiguration.openshift.io/v1/kubeletconfigs",
    ("operator.openshift.io/v1", "MachineConfiguration"):
        "/apis/operator.openshift.io/v1/machineconfigurations",
}  # fmt: skip
_KINDS = {kind: path for (_, kind), path in _PATHS.items()}


def collection(obj_or_kind: dict[str, Any] | str) -> str:
    if isinstance(obj_or_kind, str):
        return _KINDS[obj_or_kind]
    path = _PATHS[(obj_or_kind["apiVersion"], obj_or_kind["kind"])]
    return path.format(namespace=obj_or_kind["metadata"].get("namespace", ""))


async def put_object(cluster: AdminClient, obj: dict[str, Any]) -> dict[str, Any]:
    """Create, or replace what is there (keeping its resourceVersion), as an admin."""
    base = collection(obj)
    status, data = await cluster.request("POST", base, obj)
    if status == 409:
        name = obj["metadata"]["name"]
        current = await cluster.call("GET", f"{base}/{name}")
        body = {
            **obj,
            "metadata": {
                **obj["metadata"],
                "resourceVersion": current["metadata"]["resourceVersion"],
            },
        }
        return await cluster.call("PUT", f"{base}/{name}", body)
    if not 200 <= status < 300:
        raise RuntimeError(f"POST {base}: {status} {data}")
    return data


class WatchRefused(RuntimeError):
    """The server answered a watch request with an HTTP error before any event."""

    def __init__(self, path: str, status: int, text: str) -> None:
        super().__init__(f"watch {path}: {status} {text}")
        self.status = status


async def admin_watch(cluster: AdminClient, path: str, params: dict[str, str]):
    """Watch events as an admin: one dict each, until the stream ends."""
    session = await cluster.session()
    query = {**params, "watch": "1", "allowWatchBookmarks": "true", "timeoutSeconds": "60"}
    async with session.get(
        cluster.url + path, params=query, timeout=aiohttp.ClientTimeout(total=None, sock_read=90)
    ) as resp:
        if resp.status != 200:
            raise WatchRefused(path, resp.status, await resp.text())
        async for line in resp.content:
            if line.strip():
                yield json.loads(line)


async def follow(cluster: AdminClient, path: str, params: dict[str, str],
                 record: Callable[[dict[str, Any]], Awaitable[None]]) -> None:  # fmt: skip
    """Every object of a collection as it is listed and as it changes, until cancelled: resume
    from the last resourceVersion, relist on an ERROR event, and ride out server restarts."""
    rv = ""
    while True:
        try:
            if not rv:
                listed = await cluster.call("GET", path, params=params)
                rv = listed["metadata"]["resourceVersion"]
                for item in listed["items"]:
                    await record(item)
            async for event in admin_watch(cluster, path, {**params, "resourceVersion": rv}):
                if event["type"] == "ERROR":
                    rv = ""  # 410 or 504: relist
                    break
                rv = event["object"]["metadata"]["resourceVersion"]
                if event["type"] in ("ADDED", "MODIFIED"):
                    await record(event["object"])
        except asyncio.CancelledError:
            raise
        except Exception:  # the server restarting: watch again from where we were
            await asyncio.sleep(0.2)
