"""Which MachineConfigPool a Node belongs to, by the machine-config-controller's rule.

Re-derived from openshift/machine-config-operator `pkg/helpers/helpers.go` (`ListPools`,
`GetPoolsForNode`, `GetPrimaryPoolNameForMCN`): a pool holds a Node when its `spec.nodeSelector`
matches the Node's labels (an empty or missing selector matches nothing); `master` wins over a
custom pool, a single custom pool wins over `worker`, two custom pools are an error, and a
Windows Node has no pool. The rule is pure; `node_pool` only lists the pools through the API.
A pool or selector of a shape the rule cannot read is a PoolError naming the pool and the field,
as an invalid operator is: the caller reports it, nothing crashes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from agent.cluster.kube import MC_GROUP, Kube, custom_path

MACHINECONFIGPOOLS = custom_path(*MC_GROUP, "machineconfigpools")
MASTER, WORKER = "master", "worker"
# The upgrade monitor's placeholder while a Node has no pool yet (upgrade_monitor.go NotYetSet).
NOT_YET_SET = "not-yet-set"
_OS_LABEL = "kubernetes.io/os"


class PoolError(Exception):
    """The pools cannot say which one holds the Node."""


def selector_matches(selector: Mapping[str, Any] | None, labels: Mapping[str, str]) -> bool:
    """A metav1.LabelSelector against a label set; an empty selector matches nothing, as the
    controller guards against a pool that would otherwise swallow every Node."""
    if not selector:
        return False
    if not isinstance(selector, Mapping):
        raise PoolError("invalid label selector: expected an object")
    match_labels = selector.get("matchLabels") or {}
    expressions = selector.get("matchExpressions") or []
    if not isinstance(match_labels, Mapping):
        raise PoolError("invalid label selector: matchLabels: expected an object")
    if not isinstance(expressions, list):
        raise PoolError("invalid label selector: matchExpressions: expected a list")
    if not match_labels and not expressions:
        return False
    if any(labels.get(key) != value for key, value in match_labels.items()):
        return False
    return all(_expression_matches(expr, labels) for expr in expressions)


def _expression_matches(expr: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    if not isinstance(expr, Mapping):
        raise PoolError("invalid label selector: matchExpressions: expected objects")
    key, operator = expr.get("key", ""), expr.get("operator", "")
    if not isinstance(key, str):
        raise PoolError("invalid label selector: matchExpressions: key: expected a string")
    values = expr.get("values") or []
    if not isinstance(values, list):
        raise PoolError(f"invalid label selector: values of {key!r}: expected a list")
    if operator in ("In", "NotIn"):
        if not values:
            raise PoolError(f"invalid label selector: {operator} on {key!r} needs values")
        if operator == "In":
            return key in labels and labels[key] in values
        return key not in labels or labels[key] not in values
    if operator in ("Exists", "DoesNotExist"):
        if values:
            raise PoolError(f"invalid label selector: {operator} on {key!r} takes no values")
        return (key in labels) == (operator == "Exists")
    raise PoolError(f"invalid label selector: unknown operator {operator!r} on {key!r}")


def pools_for_node(
    node_name: str, labels: Mapping[str, str], pools: Iterable[Mapping[str, Any]]
) -> list[str]:
    """The names of the pools that hold the Node, the primary one first (a custom pool is
    followed by `worker` when that matches too); [] when none does."""
    if labels.get(_OS_LABEL) == "windows":
        return []  # the MCO does not manage Windows nodes
    names = [_name(pool) for pool in pools if _holds(pool, labels)]
    custom = sorted(n for n in names if n not in (MASTER, WORKER))
    if len(custom) > 1:
        raise PoolError(
            f"node {node_name} belongs to {len(custom)} custom pools ({', '.join(custom)}); "
            "a node may be in at most one custom pool besides worker"
        )
    worker = [WORKER] if WORKER in names else []
    if custom:
        # A control-plane node that also matches a custom pool stays in master.
        return [MASTER if MASTER in names else custom[0], *worker]
    return [MASTER] if MASTER in names else worker


def _name(pool: Any) -> str:
    meta = pool.get("metadata") if isinstance(pool, Mapping) else None
    name = meta.get("name") if isinstance(meta, Mapping) else None
    return name if isinstance(name, str) else ""


def _holds(pool: Any, labels: Mapping[str, str]) -> bool:
    """Whether `pool`'s nodeSelector matches; PoolError naming the pool when unreadable."""
    what = f"machineconfigpool {_name(pool) or '?'}"
    spec = pool.get("spec") if isinstance(pool, Mapping) else None
    if not isinstance(spec, Mapping | None):
        raise PoolError(f"{what}: spec: expected an object")
    try:
        return selector_matches((spec or {}).get("nodeSelector"), labels)
    except PoolError as exc:
        raise PoolError(f"{what}: spec.nodeSelector: {exc}") from None


def primary_pool(
    node_name: str, labels: Mapping[str, str], pools: Iterable[Mapping[str, Any]]
) -> str | None:
    found = pools_for_node(node_name, labels, pools)
    return found[0] if found else None


async def node_pool(api: Kube, node: Mapping[str, Any]) -> str:
    """The Node's primary pool from the pools the API lists; `not-yet-set` when none holds it
    (a Node still being provisioned), as the controller reports it."""
    meta = node.get("metadata") or {}
    listing = await api.get(MACHINECONFIGPOOLS)
    pool = primary_pool(meta.get("name", ""), meta.get("labels") or {}, listing.get("items") or [])
    return pool or NOT_YET_SET
