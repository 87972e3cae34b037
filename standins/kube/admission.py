"""Admission for writes through the API, as kube-apiserver runs it after authorization:

* TaintNodesByCondition (plugin/pkg/admission/nodetaint): a Node created through the API gets
  `node.kubernetes.io/not-ready:NoSchedule` unless it has that taint already.
* ValidatingAdmissionPolicy (admissionregistration.k8s.io/v1 policies and their bindings, stored
  like any object): on CREATE and UPDATE (a PATCH is an UPDATE) of a matched resource, the
  bound policies' matchConditions and validations are evaluated as CEL with cel-python (the
  real CEL language; `import celpy` happens only when a bound policy matches a request, so the
  demo and the agent never need it). Variables: `request` (kind, resource, subResource, name,
  namespace, operation, userInfo{username, groups, extra}, dryRun), `object`, `oldObject`,
  `namespaceObject`, `params` (null: paramKind is not supported) and `variables` (the policy's
  own, evaluated in order). The refusal has the real plugin's wording and codes
  (staging/src/k8s.io/apiserver/pkg/admission/plugin/policy/validating: dispatcher.go,
  validator.go, and plugin/cel/filter.go for the error texts).

The in-process store helpers (`FakeKube.put`, `patch`, ...) bypass admission, as they bypass
authorization: test setup writes what it wants.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import deque
from dataclasses import dataclass
from typing import Any

from .auth import Identity
from .cel import Cel
from .changes import Change, Obj
from .errors import ApiError
from .resources import Registry, ResourceType
from .selectors import label_selector_matches
from .store import Admit, Store

GROUP = "admissionregistration.k8s.io"
POLICIES = "validatingadmissionpolicies"
BINDINGS = "validatingadmissionpolicybindings"
NOT_READY_TAINT = {"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"}
# celconfig.MaxEvaluatedMessageExpressionSizeBytes: a longer messageExpression result is dropped.
MAX_MESSAGE_BYTES = 5 * 1024
# The refusal's code by its reason: reasonToCode in kubernetes staging/src/k8s.io/apiserver/
# pkg/admission/plugin/policy/validating/policy_decision.go (checked there): these four, and
# anything else 422.
REASON_CODES = {"Forbidden": 403, "Unauthorized": 401, "RequestEntityTooLarge": 413,
                "Invalid": 422}  # fmt: skip


def taint_not_ready(node: Obj) -> None:
    """What TaintNodesByCondition does to a Node on CREATE (a taint matches on key and effect)."""
    spec = node.get("spec")
    if not isinstance(spec, dict):
        spec = node["spec"] = {}
    taints = spec.get("taints")
    if not isinstance(taints, list):
        taints = spec["taints"] = []
    if not any(
        isinstance(t, dict)
        and (t.get("key"), t.get("effect")) == (NOT_READY_TAINT["key"], NOT_READY_TAINT["effect"])
        for t in taints
    ):
        taints.append(dict(NOT_READY_TAINT))


@dataclass(frozen=True)
class Request:
    """admission.Attributes: what is being written, by whom."""

    operation: str  # CREATE or UPDATE
    rt: ResourceType
    subresource: str
    namespace: str
    name: str
    identity: Identity
    dry_run: bool


@dataclass(frozen=True)
class _Denial:
    message: str
    reason: str  # "" means Invalid, as for an evaluation error


def _aggregate(errors: list[str]) -> str:
    """utilerrors.NewAggregate(...).Error(): one message as is, several deduplicated in []."""
    unique = list(dict.fromkeys(errors))
    return unique[0] if len(unique) == 1 else "[" + ", ".join(unique) + "]"


def _rule_matches(rule: dict[str, Any], req: Request) -> bool:
    """A NamedRuleWithOperations (webhook/predicates/rules: operations, groups, versions,
    resources with `*` and `x/sub` forms, scope, resourceNames)."""
    ops = rule.get("operations") or []
    groups, versions = rule.get("apiGroups") or [], rule.get("apiVersions") or []
    if not ({"*", req.operation} & set(ops)) or not ({"*", req.rt.group} & set(groups)):
        return False
    if not {"*", req.rt.version} & set(versions):
        return False
    # "*" alone matches every resource but no subresource; "pods/*" pods and its subresources.
    if not any(
        res in ("*", req.rt.plural) and sub in ("*", req.subresource)
        for res, _, sub in (str(r).partition("/") for r in rule.get("resources") or [])
    ):
        return False
    scope = rule.get("scope") or "*"
    if (scope == "Cluster" and req.namespace) or (scope == "Namespaced" and not req.namespace):
        return False
    names = rule.get("resourceNames") or []
    return not names or req.name in names


class Admission:
    """One server's admission chain. Policies and bindings take effect `policy_delay` seconds
    after they are written (the real plugin sees them through informers: 0.2-0.6 s in the
    conformance run), so a change seen by no request yet is applied on the next one."""

    def __init__(self, store: Store, registry: Registry, policy_delay: float = 0.0) -> None:
        self.store = store
        self._namespaces = registry.resolve("namespaces")
        self.policy_delay = policy_delay
        self._lock = threading.Lock()
        self._effective: dict[tuple[str, str], Obj] = {}
        self._pending: deque[tuple[float, tuple[str, str], Obj | None]] = deque()
        self._cel = Cel()
        store.add_hook(self._observe)

    # -- the policy plugin's view of the store ------------------------------------------------

    def _observe(self, change: Change) -> None:
        if change.rt.group != GROUP or change.rt.plural not in (POLICIES, BINDINGS):
            return
        key = (change.rt.plural, change.obj["metadata"]["name"])
        obj = None if change.type == "DELETED" else change.obj
        with self._lock:
            self._pending.append((time.monotonic() + self.policy_delay, key, obj))

    def _current(self) -> tuple[list[Obj], list[Obj]]:
        """(policies, bindings) in effect now, each sorted by name."""
        now = time.monotonic()
        with self._lock:
            while self._pending and self._pending[0][0] <= now:
                _, key, obj = self._pending.popleft()
                if obj is None:
                    self._effective.pop(key, None)
                else:
                    self._effective[key] = obj
            objs = sorted(self._effective.items())
        return ([o for (plural, _), o in objs if plural == POLICIES],
                [o for (plural, _), o in objs if plural == BINDINGS])  # fmt: skip

    # -- entry point ------------------------------------------------------------------------

    def admitter(
        self,
        identity: Identity,
        rt: ResourceType,
        subresource: str,
        namespace: str,
        dry_run: bool,
    ) -> Admit:
        """The `admit` a write through the API hands to the store."""

        new_node = rt.group == "" and rt.plural == "nodes" and not subresource

        def admit(operation: str, obj: Obj, old: Obj | None) -> None:
            if operation == "CREATE" and new_node:
                taint_not_ready(obj)  # mutating admission runs before validating admission
            meta = obj.get("metadata") or {}
            req = Request(
                operation,
                rt,
                subresource,
                namespace,
                str(meta.get("name") or meta.get("generateName") or ""),
                identity,
                dry_run,
            )
            self._validate(req, obj, old)

        return admit

    # -- ValidatingAdmissionPolicy ----------------------------------------------------------

    def _validate(self, req: Request, obj: Obj, old: Obj | None) -> None:
        policies, bindings = self._current()
        if not bindings:
            return
        activation: dict[str, Any] | None = None
        for policy in policies:
            spec = policy.get("spec") or {}
            name = policy["metadata"]["name"]
            own = [b for b in bindings if (b.get("spec") or {}).get("policyName") == name]
            if not own or not self._matches(spec.get("matchConstraints"), req, obj, old, True):
                continue
            for binding in own:
                bspec = binding.get("spec") or {}
                if not self._matches(bspec.get("matchResources"), req, obj, old, False):
                    continue
                if "Deny" not in (bspec.get("validationActions") or []):
                    continue  # Warn and Audit leave no trace here
                if activation is None:  # the first binding that applies: now CEL is needed
                    activation = self._activation(req, obj, old)
                denials = self._evaluate(spec, activation)
                if denials:
                    raise self._refusal(req, name, binding["metadata"]["name"], denials[0])

    def _matches(
        self, match: dict[str, Any] | None, req: Request, obj: Obj, old: Obj | None, policy: bool
    ) -> bool:
        """matchConstraints (policy) / matchResources (binding: absent means what the policy
        matches) per generic/matching.go."""
        if match is None:
            return not policy
        if not self._namespace_matches(match.get("namespaceSelector"), req, obj):
            return False
        selector = match.get("objectSelector")
        if selector is not None and not any(
            label_selector_matches(selector, (o.get("metadata") or {}).get("labels") or {})
            for o in (obj, old)
            if o is not None
        ):
            return False
        if any(_rule_matches(r, req) for r in match.get("excludeResourceRules") or []):
            return False
        rules = match.get("resourceRules") or []
        return not rules or any(_rule_matches(r, req) for r in rules)

    def _namespace_matches(self, selector: dict[str, Any] | None, req: Request, obj: Obj) -> bool:
        if selector is None:
            return True
        if req.rt.group == "" and req.rt.plural == "namespaces":
            labels = (obj.get("metadata") or {}).get("labels") or {}
        elif not req.namespace:
            return True  # a cluster-scoped object is never exempted by a namespace selector
        else:
            ns = self.store.try_get(self._namespaces, req.namespace) or {}
            labels = (ns.get("metadata") or {}).get("labels") or {}
        return label_selector_matches(selector, labels)

    def _activation(self, req: Request, obj: Obj, old: Obj | None) -> dict[str, Any]:
        gvk = {"group": req.rt.group, "version": req.rt.version, "kind": req.rt.kind}
        gvr = {"group": req.rt.group, "version": req.rt.version, "resource": req.rt.plural}
        user: dict[str, Any] = {"username": req.identity.user, "groups": list(req.identity.groups)}
        if req.identity.extra:  # omitempty: has(request.userInfo.extra) is false without any
            user["extra"] = {k: list(v) for k, v in req.identity.extra.items()}
        request: dict[str, Any] = {
            "uid": str(uuid.uuid4()), "kind": gvk, "resource": gvr, "requestKind": gvk,
            "requestResource": gvr, "operation": req.operation, "userInfo": user,
            "dryRun": req.dry_run,
        }  # fmt: skip
        optional = {"subResource": req.subresource, "requestSubResource": req.subresource,
                    "name": req.name, "namespace": req.namespace}  # fmt: skip
        request.update((k, v) for k, v in optional.items() if v)  # omitempty
        namespace = self.store.try_get(self._namespaces, req.namespace) if req.namespace else None
        return self._cel.activation({"request": request, "object": obj, "oldObject": old,
                                     "namespaceObject": namespace, "params": None})  # fmt: skip

    def _evaluate(self, spec: dict[str, Any], activation: dict[str, Any]) -> list[_Denial]:
        """The denials of one policy for one binding, in the order of its validations
        (validator.go: errors follow failurePolicy, default Fail)."""
        fail = spec.get("failurePolicy", "Fail") != "Ignore"
        errors: list[str] = []
        for condition in spec.get("matchConditions") or []:
            value, error = self._cel.evaluate(str(condition.get("expression", "")), activation)
            if error is not None:
                errors.append(error)
            elif value is False:
                return []  # any false condition: the policy does not apply
        if errors:
            return [_Denial(_aggregate(errors), "")] if fail else []
        activation = {**activation, "variables": self._variables(spec, activation)}
        denials = []
        for validation in spec.get("validations") or []:
            expression = str(validation.get("expression", ""))
            value, error = self._cel.evaluate(expression, activation)
            if error is not None:
                if fail:
                    denials.append(_Denial(error, ""))
                continue
            if value is True:
                continue
            denials.append(_Denial(self._message(validation, activation),
                                   str(validation.get("reason") or "Invalid")))  # fmt: skip
        return denials

    def _variables(self, spec: dict[str, Any], activation: dict[str, Any]) -> Any:
        """spec.variables, each able to use those before it; one that fails is left out (a
        validation using it then fails with an error, as the real lazy evaluation would)."""
        values: dict[str, Any] = {}
        for variable in spec.get("variables") or []:
            value, error = self._cel.evaluate_raw(
                str(variable.get("expression", "")),
                {**activation, "variables": self._cel.map_of(values)},
            )
            if error is None:
                values[str(variable.get("name"))] = value
        return self._cel.map_of(values)

    def _message(self, validation: dict[str, Any], activation: dict[str, Any]) -> str:
        """messageExpression (a one-line string within the size limit), else message, else
        "failed expression: ..." (validator.go)."""
        message = ""
        if validation.get("messageExpression"):
            value, error = self._cel.evaluate(str(validation["messageExpression"]), activation)
            if error is None and isinstance(value, str):
                message = value.strip()
                if len(message.encode()) > MAX_MESSAGE_BYTES or "\n" in message:
                    message = ""
        if not message:
            message = str(validation.get("message") or "").strip()
        return message or f"failed expression: {str(validation.get('expression', '')).strip()}"

    @staticmethod
    def _refusal(req: Request, policy: str, binding: str, denial: _Denial) -> ApiError:
        """dispatcher.go: admission.NewForbidden around the first denial, with the validation's
        reason (Invalid when none) and its code."""
        cause = f"ValidatingAdmissionPolicy '{policy}' with binding '{binding}' denied request: "
        cause += denial.message
        name = req.name or "Unknown"
        reason = denial.reason or "Invalid"
        details: dict[str, Any] = {"name": name, "kind": req.rt.plural,
                                   "causes": [{"message": cause}]}  # fmt: skip
        if req.rt.group:
            details["group"] = req.rt.group
        return ApiError(
            REASON_CODES.get(reason, 422),
            reason,
            f'{req.rt.qualified} "{name}" is forbidden: {cause}',
            details,
        )
