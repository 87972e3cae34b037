"""What a cluster pass reads before it acts, and Unusable for input it cannot use.

The desired state, the baseline config, the live policy, the certificates and the first-boot
annotations. Unusable input names the object and the field; the pass reports it Degraded and
acts on nothing. ClusterOptions, what the command line asks of the agent, is here too."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from agent.cluster import annotations as A
from agent.cluster import kubeconfig as kc
from agent.cluster.certs import certificates, rotate_if_published, write_certificates
from agent.cluster.kube import Kube
from agent.cluster.prestager import PrestageOptions
from agent.cluster.reports import ClusterReports
from agent.cluster.watch import NamedWatch, ObjectWatch
from agent.core.desired import Desired
from agent.core.policy import BUILTIN_POLICY, Allowlist, policy_from_machine_configuration
from agent.errors import HostError, InputError, parsing
from agent.model.etc_drift import DEFAULT_ETC_IGNORE
from agent.model.imageref import parse_image_ref
from agent.model.machineconfig import parse_machine_config
from agent.update.engine import DEGRADED, Engine, Outcome

NODE_ANNOTATIONS_FILE = "/etc/machine-config-daemon/node-annotations.json"
T = TypeVar("T")


class Unusable(Exception):
    """Input a pass cannot use. `error.source` names the object (`machineconfig <name>`,
    `controllerconfig machine-config-controller`, a path on the host), `error.field` the field.
    `watched`: a watch wakes the agent when the object changes; otherwise the pass is retried
    with backoff."""

    def __init__(self, error: InputError, *, watched: bool = True) -> None:
        super().__init__(str(error))
        self.error, self.watched = error, watched


def parsed(what: str, parse: Callable[..., T], *args: Any) -> T:
    """`parse(*args)`, its InputError attributed to `what` (the object it reads); a parser's
    crash on a shape it did not expect is an InputError too."""
    try:
        return parsing(parse, *args, source=what)
    except InputError as exc:
        raise exc if exc.source else exc.located(what) from None


@dataclass
class ClusterOptions:
    node_name: str
    drain: str = "controller"  # "controller" (the MCO drain controller) or "self"
    drain_timeout: float = 3600.0
    uncordon_timeout: float = 600.0
    dry_run: bool = False
    max_boot_attempts: int = 1
    soft_reboot: bool = False
    prestage: PrestageOptions = field(default_factory=PrestageOptions)
    etc_ignore: tuple[str, ...] = DEFAULT_ETC_IGNORE  # /etc paths that are never drift


class ClusterInputs(ClusterReports):
    """The reading part of the cluster agent (agent.py), over the parts it sets up."""

    api: Kube
    options: ClusterOptions
    allowlist: Allowlist
    engine: Engine
    controller_config: ObjectWatch
    configuration: ObjectWatch
    current_rendered: NamedWatch

    def _pool_desired(self, rendered: dict[str, Any]) -> Desired:
        """The pool's target as this node will be asked for it: the rendered config, its
        osImageURL as the image (the controller sets desiredImage only at the node's turn)."""
        return self._desired(A.NodeView(self.name, {}), rendered)

    def _desired(self, node: A.NodeView, rendered: dict[str, Any]) -> Desired:
        """The desired state from a rendered config and the Node's desiredImage; InputError
        naming the object (`machineconfig <name>` or `node <name>`) and the field."""
        # Parsed from the very bytes the host records, so that the recorded config and the
        # desired one have the same fingerprint when their content is the same.
        # Only the name is kept of the metadata: a new resourceVersion is not a new config.
        meta = rendered.get("metadata")
        name = meta.get("name") if isinstance(meta, dict) else None
        what = f"machineconfig {name}"
        stable = {**rendered, "metadata": {"name": name}}
        document = parsed(what, lambda: json.dumps(stable, sort_keys=True).encode())
        config = parsed(what, parse_machine_config, document)
        image_text = node.get(A.DESIRED_IMAGE)
        where = (f"node {node.name}", f"metadata.annotations[{A.DESIRED_IMAGE}]")
        if not image_text:
            image_text, where = config.os_image_url, (what, "spec.osImageURL")
        target = None
        if image_text:
            try:
                target = parse_image_ref(image_text)
            except InputError as exc:
                raise InputError(exc.message, source=where[0], field=where[1]) from None
        return Desired(config, document, target)

    async def _adopt_current(self, node: A.NodeView, desired_name: str) -> None:
        """With no config recorded on the host yet, the Node's currentConfig is the baseline
        (the MCD's on-disk config starts the same way); refusals need a real baseline. One that
        cannot be parsed is Unusable: nothing is planned from a guess, and its watch (kept
        until it is adopted) brings the next pass when it is replaced."""
        if not self.options.dry_run:
            # Before anything reads the journal: a config the MCD applied after this agent
            # last ran here is the one validated against, never this agent's older record. A
            # record that cannot be read is reported where the update reads it (Degraded,
            # naming the file, retried with the update's backoff), not here.
            with contextlib.suppress(HostError):
                self.engine.follow_external()
        current_name = node.get(A.CURRENT_CONFIG)
        if (
            not current_name
            or current_name == desired_name
            or self.engine.current_config() is not None
            or self.options.dry_run
        ):
            self.current_rendered.stop()
            return
        current = await self.current_rendered.get(current_name)
        if current is None:
            self.current_rendered.stop()
            self.log.warning("current config not found; first start plans from none",
                             config=current_name)  # fmt: skip
            return
        what = f"machineconfig {current_name}"
        try:
            document = parsed(what, lambda: json.dumps(current, sort_keys=True).encode())
            parsed(what, self.engine.adopt_current, document)
        except InputError as exc:
            raise Unusable(exc) from None
        self.current_rendered.stop()

    def _refresh_policy(self) -> None:
        """The live policy: the built-in one extended by MachineConfiguration/cluster. One that
        cannot be parsed is Unusable: no update is planned with a policy the cluster did not
        ask for (the last good one stays in force for what is already running)."""
        policy = BUILTIN_POLICY
        if self.configuration.obj is not None:
            try:
                extra = parsed("machineconfiguration cluster", policy_from_machine_configuration,
                               self.configuration.obj)  # fmt: skip
            except InputError as exc:
                raise Unusable(exc) from None
            if extra is not None:
                policy = BUILTIN_POLICY.extended(extra)
        self.allowlist.policy = policy
        self.engine.policy = policy

    async def _sync_certificates(self, node: A.NodeView) -> Outcome | None:
        """The MCD's certificate writer (pkg/daemon/certificate_writer.go): the ControllerConfig's
        certificates, then the kube-apiserver serving-CA rotation of the kubeconfigs, then
        `lastSyncedControllerConfigResourceVersion` and `lastObservedServerCAAnnotation`.
        A ControllerConfig that cannot be used is Unusable (its watch brings the fix); an
        unusable rotation (the kubeconfig-data bundle, a kubeconfig on the host: no watch) is a
        Degraded outcome retried with backoff."""
        cc = self.controller_config.obj
        if cc is None or self.options.dry_run or not kc.certificates_due(cc, node.annotations):
            return None
        version = (cc.get("metadata") or {}).get("resourceVersion", "")
        try:
            certs = parsed("controllerconfig machine-config-controller", certificates, cc)
        except InputError as exc:
            raise Unusable(exc) from None
        written = await asyncio.to_thread(write_certificates, self.host.files, certs)
        for warning in written.warnings:
            self.log.warning(warning)
        self.log.info("certificates synced", changed=written.changed, resource_version=version)
        values: dict[str, str | None] = {A.LAST_SYNCED_CC: version}
        observed = kc.rotate_value(cc)
        if kc.rotation_due(cc, node.annotations):
            try:
                applied = await rotate_if_published(self.api, self.host)
            except InputError as exc:
                reason = f"kube-apiserver serving CA rotation: {exc}"
                await self._set_state("Degraded", reason)
                return Outcome(DEGRADED, reason, retryable=True)
            if not applied:
                observed = node.annotations.get(A.LAST_OBSERVED_SERVER_CA, "")
        if node.annotations.get(A.LAST_OBSERVED_SERVER_CA, "") != observed:
            values[A.LAST_OBSERVED_SERVER_CA] = observed
        if any(node.annotations.get(key) != value for key, value in values.items()):
            await self.patch_node(A.annotations_patch(values))
        return None

    async def _seed_first_boot(self) -> bool:
        """A Node with no currentConfig gets the annotations the machine-config-server left on
        the host (the controller ignores a Node without them). A file that is no JSON object
        is Unusable (no watch: retried with backoff); none at all is only logged."""
        data = await asyncio.to_thread(self.host.files.read, NODE_ANNOTATIONS_FILE)
        if data is None:
            self.log.warning("no currentConfig on the Node and no " + NODE_ANNOTATIONS_FILE)
            return False
        try:
            seeded = json.loads(data)
        except ValueError as exc:
            problem = InputError(f"invalid JSON: {exc}", source=NODE_ANNOTATIONS_FILE)
            raise Unusable(problem, watched=False) from None
        if not isinstance(seeded, dict):
            problem = InputError("expected a JSON object", source=NODE_ANNOTATIONS_FILE)
            raise Unusable(problem, watched=False)
        values = {k: str(v) for k, v in seeded.items() if k.startswith(A.PREFIX)}
        await self.patch_node(A.annotations_patch(values))
        self.log.info("seeded node annotations", keys=sorted(values))
        return True
