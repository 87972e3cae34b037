"""A thin JSON client over kubernetes-asyncio's ApiClient: raw dicts in and out, a timeout on
every call, watches as async iterators of events. The agent needs a dozen paths, not typed
models, and raw dicts keep unknown fields intact."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import aiohttp

from agent.cluster.kubeclient import (
    ApiClient,
    Configuration,
    load_incluster_config,
    load_kube_config,
)

MERGE = "application/merge-patch+json"
STRATEGIC = "application/strategic-merge-patch+json"


class KubeError(Exception):
    """A non-2xx answer, with the API's Status fields."""

    def __init__(self, status: int, reason: str = "", message: str = "") -> None:
        self.status, self.reason, self.message = status, reason, message
        super().__init__(f"{status} {reason}: {message}".strip())

    @property
    def not_found(self) -> bool:
        return self.status == 404

    @property
    def conflict(self) -> bool:
        return self.status == 409


# Failures that a retry with backoff may cure (the API server restarting, a network blip).
TRANSIENT = (aiohttp.ClientError, TimeoutError, ConnectionError, OSError)


async def load_configuration(kubeconfig: str | None) -> Configuration:
    """A kubeconfig file, or the pod's in-cluster service account when None."""
    cfg = Configuration()
    if kubeconfig:
        await load_kube_config(config_file=kubeconfig, client_configuration=cfg)
    else:
        load_incluster_config(client_configuration=cfg)
    return cfg


@dataclass
class RequestCounter:
    reads: int = 0
    writes: int = 0


class Kube:
    def __init__(self, api: ApiClient, timeout: float = 30.0) -> None:
        self.api = api
        self.timeout = timeout
        self.counter = RequestCounter()

    @classmethod
    async def connect(cls, kubeconfig: str | None, timeout: float = 30.0) -> Kube:
        return cls(ApiClient(configuration=await load_configuration(kubeconfig)), timeout)

    async def close(self) -> None:
        await self.api.close()

    async def _raw(
        self,
        method: str,
        path: str,
        *,
        query: list[tuple[str, str]] | None = None,
        body: Any = None,
        content_type: str = "application/json",
        timeout: float | None = None,
    ) -> aiohttp.ClientResponse:
        if method == "GET":
            self.counter.reads += 1
        else:
            self.counter.writes += 1
        return await self.api.call_api(
            path,
            method,
            query_params=query or [],
            header_params={"Accept": "application/json", "Content-Type": content_type},
            body=body,
            auth_settings=["BearerToken"],
            _preload_content=False,
            _request_timeout=timeout or self.timeout,
        )

    @staticmethod
    async def _error(resp: aiohttp.ClientResponse) -> KubeError:
        text = await resp.text()
        try:
            status = json.loads(text)
        except ValueError:
            status = {}
        return KubeError(resp.status, status.get("reason", resp.reason or ""),
                         status.get("message", text[:200]))  # fmt: skip

    async def request(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        resp = await self._raw(method, path, **kwargs)
        try:
            if not 200 <= resp.status < 300:
                raise await self._error(resp)
            return await resp.json(content_type=None)
        finally:
            resp.release()

    async def get(self, path: str, **query: str) -> dict[str, Any]:
        return await self.request("GET", path, query=list(query.items()))

    async def patch(self, path: str, body: dict[str, Any], kind: str = MERGE) -> dict[str, Any]:
        return await self.request("PATCH", path, body=body, content_type=kind)

    async def post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        return await self.request("POST", path, body=body)

    async def put(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """An update: 409 when `body`'s resourceVersion is not the stored one."""
        return await self.request("PUT", path, body=body)

    async def watch(
        self, path: str, query: list[tuple[str, str]], server_timeout: int = 300
    ) -> AsyncIterator[dict[str, Any]]:
        """Watch events, one dict each, until the server ends the stream."""
        query = [*query, ("watch", "1"), ("allowWatchBookmarks", "true"),
                 ("timeoutSeconds", str(server_timeout))]  # fmt: skip
        resp = await self._raw("GET", path, query=query, timeout=server_timeout + 30)
        try:
            if not 200 <= resp.status < 300:
                raise await self._error(resp)
            while line := await resp.content.readline():
                if line.strip():
                    yield json.loads(line)
        finally:
            resp.release()


def node_path(name: str) -> str:
    return f"/api/v1/nodes/{name}"


def custom_path(group: str, version: str, plural: str, name: str | None = None) -> str:
    base = f"/apis/{group}/{version}/{plural}"
    return f"{base}/{name}" if name else base


def namespaced_path(group: str, version: str, namespace: str, plural: str,
                    name: str | None = None) -> str:  # fmt: skip
    base = f"/apis/{group}/{version}/namespaces/{namespace}/{plural}"
    return f"{base}/{name}" if name else base


MC_GROUP = ("machineconfiguration.openshift.io", "v1")
MACHINECONFIGS = custom_path(*MC_GROUP, "machineconfigs")
CONTROLLERCONFIGS = custom_path(*MC_GROUP, "controllerconfigs")
MACHINECONFIGURATIONS = custom_path("operator.openshift.io", "v1", "machineconfigurations")
