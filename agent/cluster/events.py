"""Kubernetes Events on the Node, with the MCD's reasons (docs/mco-protocol.md §7).

Best effort: an event that cannot be written is logged, never fails an update. Each distinct
(reason, message) is recorded once: the event name is derived from them, so a restarted agent
does not repeat what it already said."""

from __future__ import annotations

import hashlib
import time
from typing import Any

import structlog

from agent.cluster.kube import TRANSIENT, Kube, KubeError

COMPONENT = "machineconfigdaemon"


class EventRecorder:
    def __init__(self, kube: Kube, node_name: str, namespace: str = "default") -> None:
        self.kube = kube
        self.node_name = node_name
        self.namespace = namespace
        self.node_uid = ""
        self._sent: set[str] = set()
        self.log = structlog.get_logger("events")

    def _name(self, reason: str, message: str) -> str:
        digest = hashlib.sha256(f"{reason}\0{message}".encode()).hexdigest()[:16]
        return f"{self.node_name}.{digest}"

    async def emit(self, reason: str, message: str, *, warning: bool = False) -> None:
        name = self._name(reason, message)
        if name in self._sent:
            return
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        body: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": name, "namespace": self.namespace},
            "involvedObject": {
                "kind": "Node",
                "name": self.node_name,
                "uid": self.node_uid,
                "apiVersion": "v1",
            },
            "reason": reason,
            "message": message[:1024],
            "type": "Warning" if warning else "Normal",
            "source": {"component": COMPONENT, "host": self.node_name},
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        try:
            await self.kube.post(f"/api/v1/namespaces/{self.namespace}/events", body)
        except KubeError as exc:
            if exc.status != 409:  # 409: recorded already, by us before a restart
                self.log.warning("event not recorded", reason=reason, error=str(exc))
                return
        except TRANSIENT as exc:
            self.log.warning("event not recorded", reason=reason, error=str(exc))
            return
        self._sent.add(name)
