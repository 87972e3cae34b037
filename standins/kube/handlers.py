"""HTTP layer: URL parsing, authentication, authorization, verbs and discovery."""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from typing import Any, Protocol

from aiohttp import web

from .admission import Admission
from .auth import Attributes, Identity, authorize
from .disruption import evict
from .errors import UNAUTHORIZED, ApiError, status_body
from .patch import MERGE_PATCH
from .request_log import RequestRecord
from .resources import Registry, ResourceType
from .selectors import Selector
from .watch import TRUTHY, Watched, serve_watch, wait_for_rv

_UNAUTHENTICATED_PATHS = ("/healthz", "/livez", "/readyz", "/version")
_WRITE_METHODS = ("POST", "PUT", "PATCH", "DELETE")
_ALL_VERBS = ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]


@dataclass(frozen=True)
class Target:
    """A parsed resource URL."""

    rt: ResourceType
    namespace: str | None
    name: str | None
    subresource: str | None


class Served(Watched, Protocol):
    """What the HTTP layer needs of the server it serves (FakeKube). A protocol, so that this
    module never imports the server, which imports it to build its application."""

    registry: Registry
    admission: Admission
    evicted_pods_vanish: bool
    version_info: dict[str, str]
    port: int

    def record_request(self, request: web.Request) -> RequestRecord: ...

    def check_faults(self, record: RequestRecord) -> None: ...

    def identity_for_token(self, token: str) -> Identity | None: ...


def _json(body: Any, status: int = 200) -> web.Response:
    return web.json_response(body, status=status)


class ApiHandler:
    def __init__(self, kube: Served) -> None:
        self.kube = kube
        self.registry = kube.registry
        self.store = kube.store

    # -- entry point ------------------------------------------------------------------------

    async def handle(self, request: web.Request) -> web.StreamResponse:
        record = self.kube.record_request(request)
        try:
            resp = await self._handle(request, record)
        except ApiError as err:
            resp = _json(err.status(), err.code)
        except Exception as err:  # a bug here or in a hook: still answer with a Status
            if record.status is not None:  # a stream was already open
                raise
            resp = _json(status_body(500, "InternalError", f"fakekube: {err!r}"), 500)
        if record.status is None:
            record.status = resp.status
        return resp

    async def _handle(self, request: web.Request, record: RequestRecord) -> web.StreamResponse:
        if request.method in _WRITE_METHODS:
            record.body = await request.read()  # aiohttp keeps it for the verb's own read
        path = request.path.rstrip("/") or "/"
        if path in ("/healthz", "/livez", "/readyz"):
            return web.Response(text="ok")
        identity = self._authenticate(request)
        if identity is None and path not in _UNAUTHENTICATED_PATHS:
            return _json(UNAUTHORIZED, 401)
        record.user = identity.user if identity else None
        if path == "/version":
            return _json(self.kube.version_info)
        discovery = self._discovery(path)
        if discovery is not None:
            return _json(discovery)
        assert identity is not None
        target = self._parse(path)
        verb = self._verb(request, target)
        record.verb = verb
        record.resource = target.rt.plural
        record.subresource = target.subresource
        record.namespace = target.namespace
        record.name = target.name
        self._authorize(identity, verb, target, request)
        self.kube.check_faults(record)
        return await self._dispatch(request, record, identity, verb, target)

    def _authenticate(self, request: web.Request) -> Identity | None:
        header = request.headers.get("Authorization", "")
        if not header.lower().startswith("bearer "):
            return None
        return self.kube.identity_for_token(header[7:].strip())

    # -- URL parsing ------------------------------------------------------------------------

    def _parse(self, path: str) -> Target:
        seg = [s for s in path.split("/") if s]
        if seg[0] == "api" and len(seg) > 2 and seg[1] == "v1":
            group, version, rest = "", "v1", seg[2:]
        elif seg[0] == "apis" and len(seg) > 3:
            group, version, rest = seg[1], seg[2], seg[3:]
        else:
            raise ApiError.not_found_resource()
        namespace = None
        # /api/v1/namespaces/{ns}[/status|/finalize] is the Namespace itself.
        if (
            rest[0] == "namespaces"
            and len(rest) >= 3
            and not (group == "" and len(rest) == 3 and rest[2] in ("status", "finalize"))
        ):
            namespace, rest = rest[1], rest[2:]
        if len(rest) > 3:
            raise ApiError.not_found_resource()
        rt = self.registry.lookup(group, version, rest[0])
        if rt is None:
            raise ApiError.not_found_resource()
        name = rest[1] if len(rest) > 1 else None
        sub = rest[2] if len(rest) > 2 else None
        if (sub and sub not in rt.subresources) or (namespace and not rt.namespaced):
            raise ApiError.not_found_resource()
        if rt.namespaced and name and not namespace:
            raise ApiError.not_found_resource()
        return Target(rt, namespace, name, sub)

    @staticmethod
    def _verb(request: web.Request, t: Target) -> str:
        method = request.method
        if method == "GET":
            if t.name:
                return "get"
            return "watch" if request.query.get("watch") in TRUTHY else "list"
        if method == "POST":
            return "create"
        if method == "PUT":
            return "update"
        if method == "PATCH":
            return "patch"
        if method == "DELETE":
            return "delete" if t.name else "deletecollection"
        raise ApiError(405, "MethodNotAllowed", f"method {method} is not supported")

    def _authorize(self, identity: Identity, verb: str, t: Target, request: web.Request) -> None:
        name = t.name or ""
        if verb in ("list", "watch") and not name:
            # The real request-info factory derives the name from a metadata.name selector.
            name = (
                Selector.parse(t.rt, None, request.query.get("fieldSelector")).field_equals(
                    "metadata.name"
                )
                or ""
            )
        attrs = Attributes(
            verb, t.rt.group, t.rt.plural, t.subresource or "", t.namespace or "", name
        )
        denial = authorize(identity, attrs)
        if denial is not None:
            details: dict[str, Any] = {"kind": t.rt.plural}
            if name:
                details["name"] = name
            if t.rt.group:
                details["group"] = t.rt.group
            raise ApiError(403, "Forbidden", denial.message, details)

    # -- verbs ------------------------------------------------------------------------------

    async def _dispatch(
        self,
        request: web.Request,
        record: RequestRecord,
        identity: Identity,
        verb: str,
        t: Target,
    ) -> web.StreamResponse:
        rt, q = t.rt, request.query
        dry_run = "dryRun" in q
        admit = self.kube.admission.admitter(
            identity, rt, t.subresource or "", t.namespace or "", dry_run
        )
        if t.subresource == "eviction":
            if verb != "create":
                raise ApiError(405, "MethodNotAllowed", "eviction only supports create")
            assert t.namespace and t.name
            body = await self._body(request)
            return _json(
                evict(
                    self.store,
                    self.registry,
                    t.namespace,
                    t.name,
                    body,
                    pods_vanish=self.kube.evicted_pods_vanish,
                ),
                201,
            )
        if verb == "get":
            assert t.name
            return _json(self.store.get(rt, t.name, t.namespace))
        if verb in ("list", "watch"):
            selector = Selector.parse(rt, q.get("labelSelector"), q.get("fieldSelector"))
            if verb == "watch":
                return await serve_watch(self.kube, request, record, rt, t.namespace, selector)
            rv = q.get("resourceVersion", "")
            if rv.isdigit() and int(rv) > self.store.resource_version:
                await wait_for_rv(self.kube, int(rv))
            return _json(self._list(rt, t.namespace, selector, q))
        if verb == "create":
            body = await self._object_body(request, rt)
            self._check_namespace(rt, t.namespace, body)
            if t.namespace and not self.store.try_get(
                self.registry.resolve("namespaces"), t.namespace
            ):
                raise ApiError.not_found(self.registry.resolve("namespaces"), t.namespace)
            body_name = (body.get("metadata") or {}).get("name")
            node = identity.node_name
            if node is not None and rt.plural == "nodes" and body_name != node:
                # NodeRestriction: a kubelet may only register its own Node.
                raise ApiError(
                    403,
                    "Forbidden",
                    f'nodes "{body_name}" is forbidden: node "{node}" is not allowed to modify '
                    f'node "{body_name}"',
                    {"name": body_name or "", "kind": "nodes"},
                )
            return _json(
                self.store.create(rt, body, t.namespace, dry_run=dry_run, admit=admit), 201
            )
        if verb == "update":
            assert t.name
            body = await self._object_body(request, rt)
            self._check_namespace(rt, t.namespace, body)
            body_name = (body.get("metadata") or {}).get("name")
            if body_name != t.name:
                raise ApiError.bad_request(
                    f"the name of the object ({body_name}) does not match the name on the URL "
                    f"({t.name})"
                )
            existed = self.store.try_get(rt, t.name, t.namespace) is not None
            obj = self.store.update(
                rt, body, t.namespace, subresource=t.subresource, dry_run=dry_run, admit=admit
            )
            return _json(obj, 200 if existed else 201)
        if verb == "patch":
            assert t.name
            content_type = request.headers.get("Content-Type", MERGE_PATCH).split(";")[0].strip()
            body = await self._body(request)
            return _json(
                self.store.patch(
                    rt,
                    t.name,
                    body,
                    content_type,
                    t.namespace,
                    subresource=t.subresource,
                    dry_run=dry_run,
                    admit=admit,
                )
            )
        if verb == "delete":
            assert t.name
            return await self._delete(request, t, dry_run)
        if verb == "deletecollection":
            selector = Selector.parse(rt, q.get("labelSelector"), q.get("fieldSelector"))
            items, _ = self.store.list(rt, t.namespace, selector)
            for item in items:
                self.store.delete(
                    rt, item["metadata"]["name"], item["metadata"].get("namespace"), immediate=True
                )
            return _json(self._list_body(rt, items, self.store.resource_version))
        raise ApiError(405, "MethodNotAllowed", f"{verb} is not supported")

    @staticmethod
    async def _body(request: web.Request) -> Any:
        raw = await request.read()
        if not raw:
            return None
        try:
            return json.loads(raw)
        except ValueError as err:
            raise ApiError.bad_request(f"error decoding request body: {err}") from None

    async def _object_body(self, request: web.Request, rt: ResourceType) -> dict[str, Any]:
        body = await self._body(request)
        if not isinstance(body, dict):
            raise ApiError.bad_request("the request body must be a JSON object")
        kind = body.get("kind")
        if kind and kind != rt.kind:
            raise ApiError.bad_request(
                f"the body of the request has kind {kind!r}, but this endpoint serves {rt.kind!r}"
            )
        return body

    @staticmethod
    def _check_namespace(rt: ResourceType, namespace: str | None, body: dict[str, Any]) -> None:
        body_ns = (body.get("metadata") or {}).get("namespace")
        if rt.namespaced and body_ns and namespace and body_ns != namespace:
            raise ApiError.bad_request(
                "the namespace of the provided object does not match the namespace sent on the "
                "request"
            )

    async def _delete(self, request: web.Request, t: Target, dry_run: bool) -> web.Response:
        assert t.name
        options = await self._body(request) or {}
        grace = options.get("gracePeriodSeconds", request.query.get("gracePeriodSeconds"))
        grace = int(grace) if grace is not None else 30
        immediate = True
        if t.rt.plural == "pods" and not self.kube.evicted_pods_vanish and grace > 0:
            pod = self.store.get(t.rt, t.name, t.namespace)
            # Without a kubelet a scheduled pod stays Terminating until force-deleted.
            immediate = not (pod.get("spec") or {}).get("nodeName")
        obj, gone = self.store.delete(
            t.rt,
            t.name,
            t.namespace,
            immediate=immediate,
            grace_period=grace,
            preconditions=options.get("preconditions"),
            dry_run=dry_run,
        )
        if t.rt.return_deleted_object or not gone:
            return _json(obj, 200)
        details = {"name": t.name, "kind": t.rt.plural, "uid": obj["metadata"]["uid"]}
        if t.rt.group:
            details["group"] = t.rt.group
        body = status_body(200, "", "", details)
        body.pop("message")
        body["status"] = "Success"
        return _json(body)

    # -- list -------------------------------------------------------------------------------

    def _list_body(self, rt: ResourceType, items: list[dict[str, Any]], rv: int) -> dict[str, Any]:
        if not rt.custom:
            # Typed lists from the real server carry no per-item kind/apiVersion.
            items = [{k: v for k, v in i.items() if k not in ("kind", "apiVersion")} for i in items]
        return {
            "kind": rt.list_kind,
            "apiVersion": rt.api_version,
            "metadata": {"resourceVersion": str(rv)},
            "items": items,
        }

    def _list(
        self, rt: ResourceType, namespace: str | None, selector: Selector, q: Any
    ) -> dict[str, Any]:
        rv = q.get("resourceVersion", "")
        if rv not in ("", "0"):
            try:
                want = int(rv)
            except ValueError:
                raise ApiError.bad_request(f"invalid resource version: {rv!r}") from None
            if q.get("resourceVersionMatch") == "Exact" and want < self.store.compacted_rv:
                raise ApiError.expired(
                    f"too old resource version: {want} ({self.store.compacted_rv})"
                )
        items, snapshot_rv = self.store.list(rt, namespace, selector)
        start = 0
        if q.get("continue"):
            try:
                token = json.loads(base64.urlsafe_b64decode(q["continue"]))
                last = tuple(token["last"])
            except (ValueError, KeyError, TypeError):
                raise ApiError.bad_request("continue key is not valid") from None
            keys = [(i["metadata"].get("namespace", ""), i["metadata"]["name"]) for i in items]
            start = next((n for n, k in enumerate(keys) if k > last), len(keys))
        limit = int(q.get("limit") or 0)
        page = items[start : start + limit] if limit else items[start:]
        body = self._list_body(rt, page, snapshot_rv)
        if limit and start + limit < len(items):
            tail = page[-1]["metadata"]
            token = {"rv": snapshot_rv, "last": [tail.get("namespace", ""), tail["name"]]}
            body["metadata"]["continue"] = base64.urlsafe_b64encode(
                json.dumps(token).encode()
            ).decode()
            body["metadata"]["remainingItemCount"] = len(items) - start - limit
        return body

    # -- discovery --------------------------------------------------------------------------

    def _resource_list(self, group: str, version: str) -> dict[str, Any] | None:
        resources = []
        for rt in self.registry:
            if (rt.group, rt.version) != (group, version):
                continue
            resources.append(
                {
                    "name": rt.plural,
                    "singularName": rt.singular,
                    "namespaced": rt.namespaced,
                    "kind": rt.kind,
                    "verbs": _ALL_VERBS,
                    **({"shortNames": list(rt.short_names)} if rt.short_names else {}),
                }
            )
            for sub in sorted(rt.subresources):
                resources.append(
                    {
                        "name": f"{rt.plural}/{sub}",
                        "singularName": "",
                        "namespaced": rt.namespaced,
                        "kind": "Eviction" if sub == "eviction" else rt.kind,
                        "verbs": ["create"] if sub == "eviction" else ["get", "patch", "update"],
                        **({"group": "policy", "version": "v1"} if sub == "eviction" else {}),
                    }
                )
        if not resources:
            return None
        gv = f"{group}/{version}" if group else version
        return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv,
                "resources": resources}  # fmt: skip

    def _group(self, name: str, versions: list[str]) -> dict[str, Any]:
        gvs = [{"groupVersion": f"{name}/{v}", "version": v} for v in versions]
        return {"name": name, "versions": gvs, "preferredVersion": gvs[0]}

    def _discovery(self, path: str) -> dict[str, Any] | None:
        seg = [s for s in path.split("/") if s]
        if seg == ["api"]:
            return {
                "kind": "APIVersions",
                "versions": ["v1"],
                "serverAddressByClientCIDRs": [
                    {"clientCIDR": "0.0.0.0/0", "serverAddress": f"127.0.0.1:{self.kube.port}"}
                ],
            }
        if seg == ["api", "v1"]:
            return self._resource_list("", "v1")
        groups = self.registry.groups()
        if seg == ["apis"]:
            return {
                "kind": "APIGroupList",
                "apiVersion": "v1",
                "groups": [self._group(g, vs) for g, vs in groups.items()],
            }
        if len(seg) == 2 and seg[0] == "apis" and seg[1] in groups:
            return {"kind": "APIGroup", "apiVersion": "v1", **self._group(seg[1], groups[seg[1]])}
        if len(seg) == 3 and seg[0] == "apis":
            found = self._resource_list(seg[1], seg[2])
            if found is None:
                raise ApiError.not_found_resource()
            return found
        return None


def build_app(kube: Served) -> web.Application:
    handler = ApiHandler(kube)
    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_route("*", "/{tail:.*}", handler.handle)
    return app
