"""Post-boot check in cluster mode: the Node reports Ready (the kubelet is back and healthy
in the API server's eyes), awaited on a watch within a deadline."""

from __future__ import annotations

import asyncio
from typing import Any

from agent.cluster.kube import Kube
from agent.cluster.watch import ObjectWatch
from agent.model.checks import CheckResult


def node_ready(node: dict[str, Any] | None) -> bool:
    conditions = ((node or {}).get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


async def node_ready_check(kube: Kube, node_name: str, deadline: float) -> CheckResult:
    watch = ObjectWatch(kube, "/api/v1/nodes", node_name)
    task = asyncio.create_task(watch.run())
    try:
        await watch.wait_for(node_ready, deadline)
        return CheckResult("node-ready", True, True, "Ready=True")
    except TimeoutError:
        conditions = ((watch.obj or {}).get("status") or {}).get("conditions") or []
        ready = next((c for c in conditions if c.get("type") == "Ready"), {})
        detail = f"Ready={ready.get('status', 'unknown')} {ready.get('reason', '')}".strip()
        return CheckResult("node-ready", True, False, f"{detail} after {deadline:g}s")
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
