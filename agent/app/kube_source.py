"""`run --source kube` and `run --source hypershift`: credentials, the Node's name, the Node agent.

The agents themselves are in agent/cluster/ and agent/hypershift/; this starts one with the
command line's options and stops it on a signal."""

from __future__ import annotations

import os

import structlog

from agent.app.runtime import announce_bootc, etc_ignore, until_signalled
from agent.core.policy import Allowlist
from agent.errors import InputError
from agent.host.ports import Host
from agent.observe.http import StatusBoard


async def run_cluster_source(
    host: Host, allowlist: Allowlist, args: object, board: StatusBoard | None = None
) -> int:
    """`run --source kube`: credentials, the Node's name, then the cluster agent."""
    from agent.cluster.agent import ClusterAgent, ClusterOptions
    from agent.cluster.kube import Kube
    from agent.cluster.prestager import PrestageOptions

    node_name = getattr(args, "node_name", None) or os.environ.get("NODE_NAME")
    if not node_name:
        raise InputError("no node name: pass --node-name or set NODE_NAME", field="--node-name")
    api = await Kube.connect(getattr(args, "kubeconfig", None))
    node_kubeconfig = getattr(args, "node_kubeconfig", None)
    node_api = await Kube.connect(node_kubeconfig) if node_kubeconfig else api
    options = ClusterOptions(
        node_name=node_name,
        drain=getattr(args, "drain", "controller"),
        drain_timeout=getattr(args, "drain_timeout", 3600.0),
        dry_run=getattr(args, "dry_run", False),
        max_boot_attempts=getattr(args, "max_boot_attempts", 1),
        soft_reboot=getattr(args, "allow_soft_reboot", False),
        prestage=PrestageOptions(
            mode=getattr(args, "prestage", "pool"),
            slots=getattr(args, "prestage_slots", "auto"),
            jitter=getattr(args, "prestage_jitter", 60.0),
            retry_initial=getattr(args, "prestage_retry", 10.0),
            lease_namespace=getattr(
                args, "prestage_lease_namespace", "openshift-machine-config-operator"
            ),
            lease_seconds=getattr(args, "prestage_lease_seconds", 30),
        ),
        etc_ignore=etc_ignore(getattr(args, "etc_drift_ignore", None)),
    )
    board = board or StatusBoard()
    if not options.dry_run:
        await announce_bootc(host, board)
    agent = ClusterAgent(api, node_api, host, allowlist, options, board)
    try:
        return await until_signalled(agent.run())
    finally:
        # What this process asked of the API server, for capacity planning (a reboot ends it).
        structlog.get_logger("agent").info(
            "api requests", reads=api.counter.reads, writes=api.counter.writes,
            node_reads=node_api.counter.reads if node_api is not api else 0,
            node_writes=node_api.counter.writes if node_api is not api else 0,
        )  # fmt: skip
        await api.close()
        if node_api is not api:
            await node_api.close()


async def run_hypershift_source(
    host: Host, allowlist: Allowlist, args: object, board: StatusBoard | None = None
) -> int:
    """`run --source hypershift`: the kubelet's credentials, the Node's name, then the agent
    that stands in for the MCD pod of a hosted cluster's InPlace NodePool."""
    from agent.cluster.kube import Kube
    from agent.cluster.prestager import PrestageOptions
    from agent.hypershift.agent import HypershiftAgent, HypershiftOptions

    node_name = getattr(args, "node_name", None) or os.environ.get("NODE_NAME")
    if not node_name:
        raise InputError("no node name: pass --node-name or set NODE_NAME", field="--node-name")
    refused_retry = getattr(args, "refused_retry", 60.0)
    if not refused_retry > 0:
        raise InputError(f"must be > 0, got {refused_retry}", field="--refused-retry")
    options = HypershiftOptions(
        node_name=node_name,
        upgrade_namespace=getattr(args, "upgrade_namespace", None),
        upgrade_configmap=getattr(args, "upgrade_configmap", None),
        drain_timeout=getattr(args, "drain_timeout", 3600.0),
        dry_run=getattr(args, "dry_run", False),
        max_boot_attempts=getattr(args, "max_boot_attempts", 1),
        soft_reboot=getattr(args, "allow_soft_reboot", False),
        refused_retry=refused_retry,
        # The lanes' Leases live in the upgrade namespace (--prestage-lease-namespace is
        # cluster mode's), where deploy/hypershift/rbac.yaml lets the nodes use them.
        prestage=PrestageOptions(
            mode=getattr(args, "prestage", "pool"),
            slots=getattr(args, "prestage_slots", "auto"),
            jitter=getattr(args, "prestage_jitter", 60.0),
            retry_initial=getattr(args, "prestage_retry", 10.0),
            lease_seconds=getattr(args, "prestage_lease_seconds", 30),
        ),
    )
    api = await Kube.connect(getattr(args, "kubeconfig", None))
    board = board or StatusBoard()
    if not options.dry_run:
        await announce_bootc(host, board)
    agent = HypershiftAgent(api, host, allowlist, options, board)
    try:
        return await until_signalled(agent.run())
    finally:
        # One identity here (the kubelet's): everything is in reads/writes; the node_ fields
        # keep the line's shape the same as cluster mode's.
        structlog.get_logger("agent").info(
            "api requests", reads=api.counter.reads, writes=api.counter.writes,
            node_reads=0, node_writes=0,
        )  # fmt: skip
        await api.close()
