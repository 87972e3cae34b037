"""RBAC manifests to `Rule`s: what the RBAC authorizer grants one user, read from the Roles,
ClusterRoles and their bindings an operator applies (e.g. deploy/rbac.yaml's documents).

A ClusterRoleBinding grants its ClusterRole everywhere; a RoleBinding grants its Role (or a
ClusterRole) in the binding's namespace only. resourceNames carry over; nonResourceURLs and
aggregated ClusterRoles are not modelled (the fake serves no such paths).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from .auth import NODE_USER_PREFIX, Rule, service_account_groups, service_account_user

NODE_GROUPS = ("system:nodes", "system:authenticated")

Doc = Mapping[str, Any]


def _subject_applies(subject: Doc, user: str, groups: Iterable[str], binding_ns: str) -> bool:
    kind, name = subject.get("kind"), subject.get("name")
    if kind == "User":
        return name == user
    if kind == "Group":
        return name in groups
    if kind == "ServiceAccount":
        # As the RBAC authorizer does: a RoleBinding may name a service account of its own
        # namespace without repeating it.
        namespace = subject.get("namespace") or binding_ns
        return bool(namespace) and user == service_account_user(namespace, str(name))
    return False


def _role_rules(role: Doc, namespace: str) -> list[Rule]:
    out = []
    for rule in role.get("rules") or []:
        names = tuple(rule.get("resourceNames") or ())
        for group in rule.get("apiGroups") or ():
            for resource in rule.get("resources") or ():
                for verb in rule.get("verbs") or ():
                    out.append(Rule(verb, group, resource, namespace, names))
    return out


def rules_for_user(documents: Iterable[Doc | None], user: str, groups: Iterable[str]) -> list[Rule]:
    """The rules `documents` (parsed manifests; other kinds and None are skipped) grant `user`
    as a member of `groups`, each once, in the order of the bindings."""
    docs = [d for d in documents if isinstance(d, Mapping)]
    groups = tuple(groups)

    def role(kind: str, name: str, namespace: str) -> Doc | None:
        for d in docs:
            meta = d.get("metadata") or {}
            if (
                d.get("kind") == kind
                and meta.get("name") == name
                and (kind == "ClusterRole" or meta.get("namespace", "default") == namespace)
            ):
                return d
        return None

    rules: list[Rule] = []
    for binding in docs:
        kind = binding.get("kind")
        if kind not in ("ClusterRoleBinding", "RoleBinding"):
            continue
        namespace = (
            (binding.get("metadata") or {}).get("namespace", "default")
            if kind == "RoleBinding"
            else ""
        )
        subjects = binding.get("subjects") or []
        if not any(_subject_applies(s, user, groups, namespace) for s in subjects):
            continue
        ref = binding.get("roleRef") or {}
        ref_kind = ref.get("kind")
        if ref_kind not in ("ClusterRole", "Role") or (ref_kind == "Role" and not namespace):
            continue
        found = role(ref_kind, str(ref.get("name")), namespace)
        if found is None:  # a binding to a missing role grants nothing, as for real
            continue
        rules.extend(r for r in _role_rules(found, namespace) if r not in rules)
    return rules


def service_account_rules(documents: Iterable[Doc | None], namespace: str, name: str) -> list[Rule]:
    """The rules `documents` grant the service account `namespace/name` (its user, and the
    groups every service-account token carries)."""
    return rules_for_user(
        documents, service_account_user(namespace, name), service_account_groups(namespace)
    )


def node_rules(documents: Iterable[Doc | None], node: str) -> list[Rule]:
    """The rules `documents` grant the kubelet of `node` (user `system:node:<node>`, group
    system:nodes, as its client certificate or token says), on top of what the Node
    authorizer allows it (auth.py): e.g. deploy/hypershift/rbac.yaml's Roles and ClusterRole
    bound to that group."""
    return rules_for_user(documents, NODE_USER_PREFIX + node, NODE_GROUPS)
