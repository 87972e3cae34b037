"""How an OS image may be staged under the host's signature policy: verified by bootc, refused
before anything is pulled, or staged unverified because no policy asks for a signature.

- no /etc/containers/policy.json: staged unverified, as the MCD stages;
- a policy containers/image would not accept: refused, naming the field;
- the image's scope `reject`s: refused;
- the scope requires a signature: `bootc switch --enforce-container-sigpolicy`; where the
  policy's default is insecureAcceptAnything (OpenShift's), with that default made `reject`
  for the stage alone, since bootc refuses to enforce such a policy;
- the scope accepts anything: enforced all the same when the default allows it (bootc then
  checks nothing more than the policy says), unverified when the default is
  insecureAcceptAnything too: nobody asked for a signature.
"""

from __future__ import annotations

from dataclasses import dataclass

from agent.errors import HostError, InputError
from agent.model.imageref import ImageRef
from agent.model.sigpolicy import POLICY_PATH, REJECT, SIGNED, parse_policy

# Files whose change alters what a stage verifies: a pre-stage never runs before they are
# written (they are written at the node's turn, before its stage).
TRUST_FILES = (
    POLICY_PATH,
    "/etc/containers/registries.d/",
    "/etc/machine-config-daemon/no-reboot/containers-gpg.pub",
)


@dataclass(frozen=True)
class StageTrust:
    """What the stage of one image is told about signatures. `scope` names the policy entry
    that governs the image, for reasons; `policy` replaces the host's policy.json for the
    stage only; `refusal` says why nothing may be staged."""

    enforce: bool = False
    scope: str = ""
    policy: bytes | None = None
    refusal: str | None = None


def stage_trust(policy: bytes | None, image: ImageRef) -> StageTrust:
    """The StageTrust for staging `image` on a host whose policy.json holds `policy` (None: the
    host has none)."""
    if policy is None:
        return StageTrust(scope=f"no {POLICY_PATH}")
    try:
        parsed = parse_policy(policy)
    except InputError as exc:
        return StageTrust(scope=POLICY_PATH, refusal=f"cannot use {exc}")
    rule = parsed.rule_for(image)
    scope = f"{POLICY_PATH} {rule.describe()}"
    if rule.verdict == REJECT:
        return StageTrust(scope=scope, refusal=f"{image.name} is rejected by {scope}")
    if not parsed.default_insecure:
        return StageTrust(enforce=True, scope=scope)
    if rule.verdict == SIGNED:
        return StageTrust(enforce=True, scope=scope, policy=parsed.enforceable_policy())
    return StageTrust(scope=scope)


def trust_paths(policy: bytes | None) -> tuple[str, ...]:
    """TRUST_FILES plus the key files the host's policy names."""
    try:
        keys = parse_policy(policy).key_paths() if policy is not None else frozenset()
    except InputError:
        keys = frozenset()
    return (*TRUST_FILES, *sorted(keys))


def changes_trust(paths: list[str], policy: bytes | None) -> str | None:
    """The first of `paths` that alters what a stage verifies, if any."""
    watched = trust_paths(policy)
    for path in paths:
        if any(path == w or (w.endswith("/") and path.startswith(w)) for w in watched):
            return path
    return None


def admitted(image: ImageRef, trust: StageTrust | None, verb: str) -> tuple[str, StageTrust]:
    """What a stage or pre-pull of `image` may run with: `NAME@DIGEST` (bootc canonicalizes
    name:tag@d to name@d, and a pre-pull must store that exact string) and the trust; the
    refusal (HostError kind `input` or `signature`) before anything runs."""
    if not image.pinned or image.digest is None:
        raise HostError(f"refusing to {verb} {image}: not pinned by digest", kind="input")
    trust = trust or StageTrust()
    if trust.refusal:
        raise HostError(trust.refusal, kind="signature")
    return str(image.with_digest(image.digest)), trust
