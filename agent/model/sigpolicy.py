"""The host's container signature policy (containers-policy.json(5)), as far as staging an OS
image needs it: which scope's requirements govern an image, and how bootc can be made to
enforce them.

Lookup follows containers/image (`signature/policy_eval.go`, `requirementsForImageRef`): in the
`docker` transport (bootc's `--transport registry`), the image's own identity (`name@digest`),
then each namespace from the repository up to the host, then `*.domain` wildcards, then the
transport's "" scope; else the policy's `default`.

bootc's `--enforce-container-sigpolicy` refuses a policy whose `default` is exactly
`[insecureAcceptAnything]` (ostree-ext `container_policy_is_default_insecure`), and without the
flag bootc runs its image proxy with an insecure policy: it verifies nothing. OpenShift renders
exactly that default next to scoped `sigstoreSigned`/`signedBy` entries (ClusterImagePolicy), so
for such a host the stage gets the same policy with only its `default` made `reject`
(`enforceable_policy`): the image's scope, which is what verifies it, is unchanged."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from agent.errors import InputError
from agent.model.imageref import ImageRef

POLICY_PATH = "/etc/containers/policy.json"
ACCEPT, SIGNED, REJECT = "accept", "signed", "reject"
_TYPES = {
    "insecureAcceptAnything": ACCEPT,
    "reject": REJECT,
    "signedBy": SIGNED,
    "sigstoreSigned": SIGNED,
}
_KEY_FIELDS = ("keyPath", "keyPaths", "keyData", "keyDatas", "fulcio")


@dataclass(frozen=True)
class Requirement:
    type: str
    key: str = ""  # where the key comes from, for people: a path, "keyData", "fulcio"
    key_paths: tuple[str, ...] = ()

    def describe(self) -> str:
        return f"{self.type} {self.key}".strip()


@dataclass(frozen=True)
class ScopeRule:
    """The requirements that govern one image, and where in the policy they come from."""

    scope: str  # e.g. 'transports.docker["quay.io/acme/os"]' or 'default'
    requirements: tuple[Requirement, ...]

    @property
    def verdict(self) -> str:
        """`reject` if any requirement rejects, `signed` if any needs a signature, else
        `accept` (every requirement of a scope must hold)."""
        kinds = {_TYPES[r.type] for r in self.requirements}
        return REJECT if REJECT in kinds else SIGNED if SIGNED in kinds else ACCEPT

    def describe(self) -> str:
        return f"{self.scope}: {', '.join(r.describe() for r in self.requirements)}"


@dataclass(frozen=True)
class SignaturePolicy:
    document: Mapping[str, Any]
    default: tuple[Requirement, ...]
    docker: Mapping[str, tuple[Requirement, ...]]

    @property
    def default_insecure(self) -> bool:
        """What bootc's --enforce-container-sigpolicy refuses: a default of exactly one
        insecureAcceptAnything."""
        return len(self.default) == 1 and self.default[0].type == "insecureAcceptAnything"

    def rule_for(self, image: ImageRef) -> ScopeRule:
        for scope in docker_scopes(image):
            if scope in self.docker:
                label = f'transports.docker["{scope}"]' if scope else 'transports.docker[""]'
                return ScopeRule(label, self.docker[scope])
        return ScopeRule("default", self.default)

    def key_paths(self) -> frozenset[str]:
        """Every key file the policy names: the trust of a stage depends on them too."""
        rules = [self.default, *self.docker.values()]
        return frozenset(path for rule in rules for r in rule for path in r.key_paths)

    def enforceable_policy(self) -> bytes:
        """This policy with its default made `reject`: what bootc accepts for enforcement,
        verifying an image governed by a scope exactly as the host's policy does."""
        return json.dumps({**self.document, "default": [{"type": "reject"}]}, indent=2).encode()


def docker_scopes(image: ImageRef) -> list[str]:
    """The scopes that may govern `image`, most specific first (containers/image's
    PolicyConfigurationIdentity, then PolicyConfigurationNamespaces, then "")."""
    name = image.name
    scopes = []
    if image.digest:
        scopes.append(f"{name}@{image.digest}")
    elif image.tag:
        scopes.append(f"{name}:{image.tag}")
    while True:
        scopes.append(name)
        if "/" not in name:
            break
        name = name.rsplit("/", 1)[0]
    parts = name.split(".")  # the host, with its port as containers/image keeps it
    scopes += ["*." + ".".join(parts[i:]) for i in range(1, len(parts))]
    scopes.append("")
    return scopes


def parse_policy(data: bytes) -> SignaturePolicy:
    """policy.json bytes as a SignaturePolicy; InputError naming the field when it is not one
    containers/image would accept (fail closed: an unreadable policy verifies nothing)."""
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError) as exc:
        raise InputError(f"not JSON: {exc}", source=POLICY_PATH) from None
    if not isinstance(doc, dict):
        raise InputError("expected an object", source=POLICY_PATH)
    if "default" not in doc:
        raise InputError("the default policy is missing", source=POLICY_PATH, field="default")
    default = _requirements(doc["default"], "default")
    transports = doc.get("transports", {})
    if not isinstance(transports, dict):
        raise InputError("expected an object", source=POLICY_PATH, field="transports")
    scopes = transports.get("docker", {})
    if not isinstance(scopes, dict):
        raise InputError("expected an object", source=POLICY_PATH, field="transports.docker")
    docker = {
        str(scope): _requirements(reqs, f'transports.docker["{scope}"]')
        for scope, reqs in scopes.items()
    }
    return SignaturePolicy(doc, default, docker)


def _requirements(value: object, where: str) -> tuple[Requirement, ...]:
    if not isinstance(value, list) or not value:
        raise InputError("expected a non-empty list of requirements", source=POLICY_PATH,
                         field=where)  # fmt: skip
    return tuple(_requirement(item, f"{where}[{i}]") for i, item in enumerate(value))


def _requirement(item: object, where: str) -> Requirement:
    if not isinstance(item, dict):
        raise InputError("expected an object", source=POLICY_PATH, field=where)
    kind = item.get("type")
    if kind not in _TYPES:
        raise InputError(f"unknown requirement type {kind!r}", source=POLICY_PATH,
                         field=f"{where}.type")  # fmt: skip
    paths: list[str] = []
    if isinstance(item.get("keyPath"), str):
        paths.append(item["keyPath"])
    if isinstance(item.get("keyPaths"), list):
        paths += [p for p in item["keyPaths"] if isinstance(p, str)]
    if _TYPES[kind] == SIGNED and not any(item.get(f) for f in _KEY_FIELDS):
        raise InputError("a signature requirement names no key", source=POLICY_PATH,
                         field=where)  # fmt: skip
    key = ", ".join(paths) or next((f for f in _KEY_FIELDS if item.get(f)), "")
    if kind == "signedBy" and item.get("keyType"):
        key = f"{item['keyType']} {key}"
    return Requirement(str(kind), key, tuple(paths))
