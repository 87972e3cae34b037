"""Bearer-token identities and an authorizer modelled on `--authorization-mode=Node,RBAC` plus
the NodeRestriction admission plugin.

* admin: everything is allowed.
* RBAC-like identities (service accounts, plain users): an allowlist of `Rule`s, each a
  (verb, group, resource) grant that may also be limited to one namespace (a RoleBinding's)
  and to resourceNames; plain 3-tuples are accepted everywhere and mean "everywhere, any name"
  (a ClusterRoleBinding's grant). `resource` may be `pods/eviction` or `nodes/status`; `*` is a
  wildcard for verb, group and resource. rbac.py derives them from Role/ClusterRole manifests.
* node identities `system:node:<name>` (group `system:nodes`), as the Node authorizer treats
  them: get/list/watch only their own Node (list/watch need `fieldSelector=metadata.name=<own>`),
  update/patch their own Node and nodes/<own>/status (another node: NodeRestriction 403), create
  their own Node (NodeRestriction, checked by the handler on the body), create/patch/update
  events, get/list/watch pods (system:node's static rules),
  plus any extra `rules` granted to them like an RBAC binding would.

Identities also carry `extra` (userInfo.extra, what admission policies see): a service account
whose token is bound to a pod on a node carries that node in `NODE_NAME_CLAIM`, as the real
server puts it in pod-bound tokens (ServiceAccountTokenPodNodeInfo).
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

NODE_USER_PREFIX = "system:node:"
# userInfo.extra key of a pod-bound service-account token: the node the pod runs on.
NODE_NAME_CLAIM = "authentication.kubernetes.io/node-name"


class Rule(NamedTuple):
    """One RBAC grant. The defaults make it cluster-wide for any name, as a ClusterRole bound
    with a ClusterRoleBinding; a RoleBinding's grants carry its namespace."""

    verb: str
    group: str
    resource: str  # plural, or plural/subresource
    namespace: str = ""  # "" = every namespace and the cluster scope
    names: tuple[str, ...] = ()  # resourceNames; () = any name

    @classmethod
    def of(cls, rule: RuleLike) -> Rule:
        """A Rule from a Rule or a (verb, group, resource[, namespace[, names]]) tuple."""
        if isinstance(rule, Rule):
            return rule
        verb, group, resource, *rest = rule
        namespace = str(rest[0]) if rest else ""
        names = tuple(rest[1]) if len(rest) > 1 else ()
        return cls(verb, group, resource, namespace, names)


RuleLike = Rule | tuple[str, str, str]


def service_account_user(namespace: str, name: str) -> str:
    return f"system:serviceaccount:{namespace}:{name}"


def service_account_groups(namespace: str) -> tuple[str, ...]:
    return ("system:serviceaccounts", f"system:serviceaccounts:{namespace}",
            "system:authenticated")  # fmt: skip


@dataclass(frozen=True)
class Identity:
    user: str
    token: str = field(default_factory=lambda: secrets.token_urlsafe(24))
    groups: tuple[str, ...] = ("system:authenticated",)
    rules: tuple[Rule, ...] = ()
    is_admin: bool = False
    # userInfo.extra; not hashed (a dict), copied so that the identity stays as it was made.
    extra: dict[str, list[str]] = field(default_factory=dict, hash=False)

    def __post_init__(self) -> None:
        # Callers pass plain 3-tuples; the authorizer wants Rules.
        object.__setattr__(self, "rules", tuple(Rule.of(r) for r in self.rules))
        object.__setattr__(self, "extra", {k: list(v) for k, v in self.extra.items()})

    @classmethod
    def admin(cls, user: str = "admin", token: str | None = None) -> Identity:
        return cls(
            user,
            token or secrets.token_urlsafe(24),
            ("system:masters", "system:authenticated"),
            is_admin=True,
        )

    @classmethod
    def node(
        cls, node_name: str, rules: Iterable[RuleLike] = (), token: str | None = None
    ) -> Identity:
        return cls(
            NODE_USER_PREFIX + node_name,
            token or secrets.token_urlsafe(24),
            ("system:nodes", "system:authenticated"),
            tuple(rules),
        )

    @classmethod
    def service_account(
        cls,
        namespace: str,
        name: str,
        rules: Iterable[RuleLike] = (),
        token: str | None = None,
        *,
        node: str | None = None,
        extra: Mapping[str, Iterable[str]] | None = None,
    ) -> Identity:
        """`node`: the token is bound to a pod on that node (its `NODE_NAME_CLAIM`), as the
        DaemonSet pod's projected token is; without it, a token with no node claim (one from
        the TokenRequest API with no bound pod)."""
        claims = {k: list(v) for k, v in (extra or {}).items()}
        if node is not None:
            claims[NODE_NAME_CLAIM] = [node]
        return cls(
            service_account_user(namespace, name),
            token or secrets.token_urlsafe(24),
            service_account_groups(namespace),
            tuple(rules),
            extra=claims,
        )

    @classmethod
    def user_with_rules(
        cls, user: str, rules: Iterable[RuleLike], token: str | None = None
    ) -> Identity:
        return cls(
            user,
            token or secrets.token_urlsafe(24),
            ("system:authenticated",),
            tuple(rules),
        )

    @property
    def node_name(self) -> str | None:
        if self.user.startswith(NODE_USER_PREFIX) and "system:nodes" in self.groups:
            return self.user[len(NODE_USER_PREFIX) :]
        return None


@dataclass(frozen=True)
class Attributes:
    """What the request asks to do (k8s authorizer.Attributes)."""

    verb: str
    group: str
    resource: str
    subresource: str = ""
    namespace: str = ""
    # For list/watch this is the `metadata.name=` field selector value, as the real request
    # info factory fills it in.
    name: str = ""

    @property
    def full_resource(self) -> str:
        return f"{self.resource}/{self.subresource}" if self.subresource else self.resource


@dataclass(frozen=True)
class Denial:
    message: str
    # Admission (NodeRestriction) denials happen after authorization: no RBAC grant lifts them.
    admission: bool = False


def _rule_allows(rules: Iterable[Rule], a: Attributes) -> bool:
    for verb, group, resource, namespace, names in rules:
        if verb not in ("*", a.verb) or group not in ("*", a.group):
            continue
        # A RoleBinding's grant holds in its namespace only (never for cluster-scoped objects);
        # resourceNames need the request to name the object (get, update, or a list/watch with
        # a metadata.name selector), so a create or a plain list is not granted by one.
        if (namespace and namespace != a.namespace) or (names and a.name not in names):
            continue
        if resource in ("*", a.full_resource) or (
            resource.endswith("/*") and a.full_resource.startswith(resource[:-1])
        ):
            return True
    return False


def _forbidden(identity: Identity, a: Attributes, reason: str = "") -> Denial:
    qualified = f"{a.resource}.{a.group}" if a.group else a.resource
    subject = f'{qualified} "{a.name}"' if a.name else qualified
    scope = f'in the namespace "{a.namespace}"' if a.namespace else "at the cluster scope"
    msg = (
        f'{subject} is forbidden: User "{identity.user}" cannot {a.verb} resource '
        f'"{a.full_resource}" in API group "{a.group}" {scope}'
    )
    return Denial(f"{msg}: {reason}" if reason else msg)


def _node_decision(identity: Identity, node: str, a: Attributes) -> Denial | bool | None:
    """True = allowed, Denial = denied with the Node authorizer's / admission's words,
    None = no opinion (fall through to RBAC rules)."""
    if a.group == "" and a.resource == "nodes" and a.subresource in ("", "status"):
        if a.verb in ("get", "list", "watch"):
            if a.name == node:
                return True
            if not a.name:
                return _forbidden(
                    identity, a, f"node '{node}' cannot read all nodes, only its own Node object"
                )
            return _forbidden(
                identity, a, f"node '{node}' cannot read '{a.name}', only its own Node object"
            )
        if a.verb == "create":
            return True  # the handler applies NodeRestriction to the body's name
        if a.verb in ("update", "patch"):
            if a.name == node:
                return True
            # RBAC lets the write through; NodeRestriction admission rejects it.
            return Denial(
                f'nodes "{a.name}" is forbidden: node "{node}" is not allowed to modify node '
                f'"{a.name}"',
                admission=True,
            )
        return None
    if a.resource == "events" and a.group in ("", "events.k8s.io"):
        return True if a.verb in ("create", "update", "patch") else None
    if a.group == "" and a.resource == "pods" and not a.subresource:
        return True if a.verb in ("get", "list", "watch") else None
    return None


def authorize(identity: Identity, a: Attributes) -> Denial | None:
    """None when allowed, else the Denial carrying the 403 message."""
    if identity.is_admin:
        return None
    if (node := identity.node_name) is not None:
        decision = _node_decision(identity, node, a)
        if decision is True:
            return None
        if isinstance(decision, Denial) and decision.admission:
            return decision
        if _rule_allows(identity.rules, a):
            return None
        return decision if isinstance(decision, Denial) else _forbidden(identity, a)
    if _rule_allows(identity.rules, a):
        return None
    return _forbidden(identity, a)
