"""fakekube: a loopback kube-apiserver, for `image-mode-agent demo` and the agent's tests.

It speaks real HTTP on 127.0.0.1 (aiohttp), so the agent uses the real kubernetes-asyncio
client, and it behaves like kube-apiserver v1.32 with `--authorization-mode=Node,RBAC` and the
NodeRestriction admission plugin wherever the agent depends on it: the semantics below are what
such a server (https://github.com/kubernetes/kubernetes/tree/v1.32.0), on etcd 3.5, was seen
to do, and the conformance tier (tests/conformance) runs the same scenarios against a real one.
No state is module-global: several servers may run in one process.

Quick tour::

    from standins.kube import FakeKube, Identity

    kube = FakeKube(bookmark_interval=0.2)           # keyword options, see FakeKube.__init__
    await kube.start()                               # random free port; kube.url, kube.port
    node_id = kube.node_identity("worker-0")         # system:node:worker-0 (+ optional rules)
    sa = kube.service_account("openshift-machine-config-operator", "mcd",
                              [("get", "machineconfiguration.openshift.io", "machineconfigs")])
    rules = service_account_rules(yaml.safe_load_all(rbac_yaml), "openshift-...", "agent")
    bound = kube.service_account("openshift-...", "agent", rules, node="worker-0")
    kube.write_kubeconfig(tmp_path / "kubeconfig", node_id)   # for the agent's --kubeconfig
    cfg = kube.client_configuration(node_id)         # or a kubernetes_asyncio Configuration
    kube.token_for(node_id)                          # the bearer token (admin if omitted)

    kube.put({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "worker-0"}})
    kube.get("Node", "worker-0"); kube.try_get(...); kube.list("pods", "ns", "app=x", None)
    kube.patch_annotations("Node", "worker-0", {"a": "b", "gone": None})
    kube.patch_status("Node", "worker-0", {...}); kube.patch(kind, name, body, patch_type=...)
    kube.mutate("Node", "worker-0", lambda n: n["spec"].update(unschedulable=True))
    await kube.wait_for("Node", "worker-0", lambda n: n and ..., timeout=5)
    kube.add_hook(fn)                                # fn(change) after every write

    await kube.wait_for_watches(1, "nodes")          # the agent is watching now
    kube.inject_watch_error(504)                     # end open watches with an ERROR event
    kube.expire_history()                            # resuming from an old RV -> 410
    kube.fail_requests(500, verb="patch", resource="nodes", times=2)
    await kube.stop(); await kube.start()            # same port, state kept (kube.restart())
    kube.count_requests(verb="patch", resource="nodes", user="system:node:worker-0")
    kube.requests                                    # [RequestRecord(method, path, query,
                                                     #   user, status, verb, resource, ...,
                                                     #   body)]: body is the raw bytes of a
                                                     #   write (POST/PUT/PATCH/DELETE), None
                                                     #   for a read; record.json() decodes it
    kube.enable_drain_controller(delay=0.5)          # simulated MCC drain controller
    kube.disable_drain_controller()
    RenderController(kube).start(); NodeController(kube).start()   # the MCC's render and node
                                                     # controllers, stand-ins (see below)

`kube.start_in_thread()` / `kube.stop_in_thread()` serve from a background thread instead. All
in-process store helpers are thread-safe; they are `StoreApi`'s (store_api.py), the class the
controller stand-ins act on, so that they never import the server that starts them.

Identities (`Identity` in auth.py; pass them to `FakeKube(identities=...)` or register later):
* `kube.admin` (always present): everything allowed.
* `Identity.node(name, rules=())` / `kube.node_identity(name)`: the Node authorizer and
  NodeRestriction: get/list/watch only its own Node, and list/watch only with
  `fieldSelector=metadata.name=<own>` (otherwise 403 "... node 'X' cannot read all nodes, only
  its own Node object"); create/update/patch only its own Node and nodes/<own>/status; create,
  patch, update events; get/list/watch pods (as system:node's static rules allow); plus `rules`.
* `Identity.service_account(ns, name, rules, node=None)` / `Identity.user_with_rules(user,
  rules)`: an RBAC allowlist of `Rule(verb, group, resource, namespace="", names=())`s; plain
  (verb, group, resource) tuples mean a cluster-wide grant for any name (a ClusterRoleBinding's);
  `namespace` limits one to that namespace (a RoleBinding's), `names` to those resourceNames
  (which never grant a create or an unnamed list). resource may be "pods/eviction",
  "nodes/status"; "*" is a wildcard. Anything else is 403 with the apiserver's wording (`...
  cannot get resource "configmaps" in API group "" in the namespace "X"`). No/unknown token: 401.
  `service_account_rules(documents, ns, name)` (rbac.py) reads the rules an identity gets from
  parsed Role/ClusterRole/(Cluster)RoleBinding manifests, e.g. deploy/rbac.yaml's;
  `node_rules(documents, node)` those a node's kubelet gets through group system:nodes (e.g.
  deploy/hypershift/rbac.yaml's), to pass to `node_identity`.
* Identities carry `extra` (userInfo.extra, dict[str, list[str]]); `node="worker-0"` makes a
  service-account token bound to a pod on that node: `extra` holds
  `authentication.kubernetes.io/node-name: ["worker-0"]` (NODE_NAME_CLAIM), as the real server
  puts it in pod-bound tokens.

Served resources: core v1 namespaces, nodes (+status), pods (+status, +eviction), events,
configmaps;
events.k8s.io/v1 events (stored separately, not converted); policy/v1 poddisruptionbudgets
(+status); machineconfiguration.openshift.io/v1 machineconfigs, controllerconfigs (+status),
machineconfigpools (+status), machineconfignodes (+status); operator.openshift.io/v1
machineconfigurations (+status); admissionregistration.k8s.io/v1 validatingadmissionpolicies
(+status, never written) and validatingadmissionpolicybindings, enforced (see Admission).
Add more with `FakeKube(extra_resources=[ResourceType(...)])`.
Discovery: /api, /api/v1, /apis, /apis/<g>, /apis/<g>/<v>, /version; /healthz etc.

Semantics, as observed on the real server:
* One global resourceVersion counter. No-op writes keep the RV and emit no event.
* PUT/PATCH carrying a stale metadata.resourceVersion: 409 Conflict. POST of an existing name:
  409 AlreadyExists. Errors are `Status` objects with the real reasons and wording.
* metadata.generation is kept for CRs and PDBs, bumped when anything other than metadata and
  status changes. With a status subresource the main endpoint ignores .status and /status
  writes touch only .status (nodes/status may still change metadata, as on the real server).
  Creating through the API drops .status for such types (nodes excepted); `put()` keeps it.
* PATCH: merge (RFC 7386), strategic merge (built-in types only; CRs answer 415 like the real
  server - note kubernetes_asyncio's CustomObjectsApi sends a dict body as json-patch unless
  you pass `_content_type="application/merge-patch+json"`, and that is a 400, as for real),
  JSON patch (RFC 6902). Strategic merge support is described in patch.py.
* list: labelSelector (=, ==, !=, in, notin, exists, !exists), fieldSelector (metadata.name,
  metadata.namespace, plus per-type fields such as spec.nodeName; unknown fields are 400),
  limit/continue; items of built-in types carry no kind/apiVersion, like typed lists.
* watch: initial ADDED events without resourceVersion (or "0"); replay after an RV from a
  bounded history (`history_size`); an RV that was compacted gives one ERROR event with a
  410 Status (reason "Expired", message "too old resource version: ...", as the real watch
  cache words it) and the stream closes. An RV newer than the store waits `too_large_rv_wait`
  then answers 504 ResourceVersionTooLarge. Selector transitions turn into ADDED/DELETED.
  allowWatchBookmarks gives a BOOKMARK every `bookmark_interval` s; sendInitialEvents=true ends
  the initial ADDEDs with a bookmark annotated k8s.io/initial-events-end. timeoutSeconds closes
  the stream; `default_watch_timeout` applies otherwise.
* Eviction (POST pods/<name>/eviction): 429 TooManyRequests "Cannot evict pod as it would
  violate the pod's disruption budget." when the single selecting PDB allows no disruption;
  500 if several PDBs select the pod. disruptionsAllowed is computed from minAvailable /
  maxUnavailable and the selected pods that exist, are not terminating and not
  Succeeded/Failed (no Ready check; no workload controllers, so "expected" = selected pods).
  PDB status is also kept current by a built-in hook (`pdb_status_controller=True`).
  With `evicted_pods_vanish=True` (default) evicted and deleted pods disappear at once;
  with False, a pod bound to a node stays Terminating (deletionTimestamp set) until deleted
  with gracePeriodSeconds=0 or `kube.delete(...)`, like a cluster with no kubelet.
* Namespaced creates through the API need the namespace to exist (404 otherwise); a few
  namespaces exist from the start (`namespaces=` option) and `put()` creates missing ones.
* Not supported: server-side apply, tables, protobuf, managedFields, admission webhooks.

Admission (admission.py), for writes through the API only (`put()`, `patch()`, `mutate()` and
the other in-process helpers bypass it, as they bypass authorization):
* TaintNodesByCondition: a Node created through the API (POST, or a PUT that creates) gets
  `node.kubernetes.io/not-ready:NoSchedule` unless it has that key and effect already; updates
  are left alone.
* ValidatingAdmissionPolicy: on CREATE and UPDATE (PATCH included; /status too when the rules
  name `x/status`) of a resource matched by a policy's matchConstraints (resourceRules,
  excludeResourceRules, namespaceSelector, objectSelector) and bound by a binding (its
  matchResources too), matchConditions and validations are evaluated as CEL with the cel-python
  package (`import celpy` happens only then: the demo and the agent never need it), with
  `request.userInfo.{username,groups,extra}` (no `extra` key when empty, as the real request
  omits it), `request.operation/name/namespace/subResource/...`, `object`, `oldObject`,
  `namespaceObject`, `variables`; `params` is null (no paramKind). A refusal is the real one:
  `<resource> "<name>" is forbidden: ValidatingAdmissionPolicy '<policy>' with binding
  '<binding>' denied request: <message>`, with the validation's `reason` mapped as the plugin's
  reasonToCode does (Forbidden 403, Unauthorized 401, RequestEntityTooLarge 413, Invalid and
  anything else 422; Invalid when no reason) and the message from `messageExpression` (a
  one-line string), else `message`, else `failed expression: <expr>`. An expression that does
  not compile or fails to evaluate follows failurePolicy (default Fail): a 422 Invalid refusal
  with "compilation error: ..." / "expression '...' resulted in error: ..." as the message, or
  nothing under Ignore. Only bindings with `Deny` in validationActions refuse (Warn and Audit
  are accepted and do nothing). A no-op update is evaluated too. Policies and bindings take
  effect `FakeKube(admission_policy_delay=...)` seconds after they are written (default 0; the
  real plugin picked deploy/admission.yaml's up 0.2-0.6 s after its creation).

Where it still differs from the real kube-apiserver, as the conformance tier
(tests/conformance, the same scenarios on a real server from the conformance kit that
tests/conformance/README.md describes) met it:
* Service-account tokens are static strings here, their `extra` what the test gave them;
  there they come from the TokenRequest API, expire, and a pod-bound one also carries the pod's
  name and uid and a credential id.
* ValidatingAdmissionPolicy: the real server type-checks a policy against the schemas and
  refuses at creation an expression that does not compile in its CEL environment; here a
  policy is stored unchecked (no status is written) and cel-python, which lacks the Kubernetes
  CEL libraries (quantity(), url(), authorizer, ...), decides at request time. DELETE and
  CONNECT are never matched here, nor are evictions.
* Custom resources are not validated against their CRD's schema. The real server rejects a
  MachineConfigNode status that breaks the CRD (condition enums, reason pattern, at most 20
  conditions, observedGeneration never decreasing): tests/test_mcn.py checks the agent's
  status against the kit's CRD instead.
* 410 Gone: here `expire_history()` drops the replay history at once. On the real server a
  resume from an old resourceVersion is still served from the watch cache after etcd compacts
  that revision; only a new watch cache (an API server restart) answers a 200 stream whose one
  event is an ERROR with a 410 Status, reason "Expired", message "too old resource version:
  218 (221)", the form this server uses.
* A restart here keeps the same store in memory; the kit's API server restarts with etcd, and
  no write is possible while it is down (the fake accepts in-process writes meanwhile).
* Events of other components (the MCC's) happen only there. The controllers' own writes to
  Nodes, pools, MachineConfigs and MachineConfigNodes come from stand-ins that follow the
  machine-config-operator's code at 7ff337a4, each module citing what it follows:
  `enable_drain_controller()` answers `desiredDrain` (cordon, drain, uncordon, the
  MachineConfigNode conditions: mcn_status.py), `RenderController` merges a pool's
  MachineConfigs into its rendered config, `NodeController` aims a pool's Nodes at it within
  maxUnavailable and keeps the pool's status (pool_rules.py). They act on every write, faster
  than the real ones (no 5 s requeue); layered pools, the template and kubelet-config
  controllers and the operator are not modelled.
"""

from .admission import NOT_READY_TAINT
from .auth import NODE_NAME_CLAIM, Identity, Rule, RuleLike
from .changes import Change
from .drain_controller import DESIRED_DRAIN, LAST_APPLIED_DRAIN, DrainController
from .errors import ApiError
from .node_controller import NodeController
from .rbac import node_rules, rules_for_user, service_account_rules
from .render_controller import RenderController
from .request_log import RequestRecord
from .resources import ResourceType
from .server import FakeKube

__all__ = [
    "DESIRED_DRAIN",
    "LAST_APPLIED_DRAIN",
    "NODE_NAME_CLAIM",
    "NOT_READY_TAINT",
    "ApiError",
    "Change",
    "DrainController",
    "FakeKube",
    "Identity",
    "NodeController",
    "RenderController",
    "RequestRecord",
    "ResourceType",
    "Rule",
    "RuleLike",
    "node_rules",
    "rules_for_user",
    "service_account_rules",
]
