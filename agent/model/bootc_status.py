"""`bootc status` documents (org.containers.bootc/v1 BootcHost, older v1alpha1 too).

Unknown fields are ignored and newer fields are optional, as bootc's own deserializer does."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from agent.errors import InputError
from agent.model.document import load_document, plain_value


@dataclass(frozen=True)
class ImageStatus:
    image: str
    transport: str
    digest: str
    version: str | None = None
    timestamp: str | None = None
    architecture: str | None = None
    # How bootc verified it: "containerPolicy" (--enforce-container-sigpolicy), "insecure",
    # "ostreeRemote:<remote>", or None (bootc's default: no verification).
    signature: str | None = None

    @property
    def policy_enforced(self) -> bool:
        return self.signature == "containerPolicy"


@dataclass(frozen=True)
class BootEntry:
    image: ImageStatus | None
    cached_update: ImageStatus | None = None
    incompatible: bool = False
    pinned: bool = False
    soft_reboot_capable: bool = False
    download_only: bool = False

    @property
    def digest(self) -> str | None:
        return self.image.digest if self.image else None


@dataclass(frozen=True)
class BootcHost:
    booted: BootEntry | None = None
    staged: BootEntry | None = None
    rollback: BootEntry | None = None
    rollback_queued: bool = False
    other_deployments: tuple[BootEntry, ...] = ()
    spec_image: str | None = None

    @property
    def booted_digest(self) -> str | None:
        return self.booted.digest if self.booted else None

    @property
    def staged_digest(self) -> str | None:
        return self.staged.digest if self.staged else None

    def staged_locked(self, digest: str) -> bool:
        """Whether `digest` is staged download-only: an ordinary reboot discards it."""
        return self.staged is not None and self.staged.download_only and \
            self.staged_digest == digest  # fmt: skip

    @property
    def booted_ref(self) -> str | None:
        """The booted image as `name@digest`, the only proof of what runs."""
        if not (self.booted and self.booted.image):
            return None
        name = self.booted.image.image.split("@", 1)[0]
        return f"{name}@{self.booted.image.digest}"


def _text(value: Any, where: str) -> str | None:
    """A string that may be absent; a YAML number (`version: 20231230.1`) is read as text."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, int | float) and not isinstance(value, bool):
        try:
            return str(value)
        except ValueError:  # more digits than Python prints
            pass
    raise InputError(f"expected a string, got {type(value).__name__}", field=where)


def _flag(value: Any, where: str) -> bool:
    """A boolean that may be absent or null; "false" is not a boolean (bootc's serde agrees)."""
    if value is not None and not isinstance(value, bool):
        raise InputError(f"expected a boolean, got {type(value).__name__}", field=where)
    return bool(value)


def _image_status(raw: Any, where: str) -> ImageStatus | None:
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise InputError("expected an object", field=where)
    ref = raw.get("image")
    if not isinstance(ref, dict) or not isinstance(ref.get("image"), str):
        raise InputError("missing image reference", field=f"{where}.image.image")
    digest = raw.get("imageDigest")
    if not isinstance(digest, str) or not digest:
        raise InputError("missing", field=f"{where}.imageDigest")
    return ImageStatus(
        image=ref["image"],
        transport=_text(ref.get("transport"), f"{where}.image.transport") or "registry",
        digest=digest,
        version=_text(raw.get("version"), f"{where}.version"),
        timestamp=_text(raw.get("timestamp"), f"{where}.timestamp"),
        architecture=_text(raw.get("architecture"), f"{where}.architecture"),
        signature=_signature(ref.get("signature"), f"{where}.image.signature"),
    )


def _signature(value: Any, where: str) -> str | None:
    """bootc's ImageSignature: a unit variant as a string, `{"ostreeRemote": NAME}`."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, dict) and len(value) == 1 and "ostreeRemote" in value:
        return f"ostreeRemote:{_text(value['ostreeRemote'], where + '.ostreeRemote')}"
    raise InputError("expected a string or {ostreeRemote: NAME}", field=where)


def _entry(raw: Any, where: str) -> BootEntry | None:
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise InputError("expected an object", field=where)
    return BootEntry(
        image=_image_status(raw.get("image"), f"{where}.image"),
        cached_update=_image_status(raw.get("cachedUpdate"), f"{where}.cachedUpdate"),
        incompatible=_flag(raw.get("incompatible"), f"{where}.incompatible"),
        pinned=_flag(raw.get("pinned"), f"{where}.pinned"),
        soft_reboot_capable=_flag(raw.get("softRebootCapable"), f"{where}.softRebootCapable"),
        download_only=_flag(raw.get("downloadOnly"), f"{where}.downloadOnly"),
    )


def bootc_host_from_object(obj: Any) -> BootcHost:
    obj = plain_value(obj)  # any value, not only one load_document returned
    if not isinstance(obj, dict):
        raise InputError("expected a BootcHost object")
    api = obj.get("apiVersion")
    if not isinstance(api, str) or not api.startswith("org.containers.bootc/"):
        raise InputError(f"not a bootc status document (apiVersion {api!r})", field="apiVersion")
    status = obj.get("status") or {}
    if not isinstance(status, dict):
        raise InputError("expected an object", field="status")
    spec = obj.get("spec") or {}
    spec_image = spec.get("image") if isinstance(spec, dict) else None
    others = status.get("otherDeployments") or []
    if not isinstance(others, list):
        raise InputError("expected a list", field="status.otherDeployments")
    return BootcHost(
        booted=_entry(status.get("booted"), "status.booted"),
        staged=_entry(status.get("staged"), "status.staged"),
        rollback=_entry(status.get("rollback"), "status.rollback"),
        rollback_queued=_flag(status.get("rollbackQueued"), "status.rollbackQueued"),
        other_deployments=tuple(
            e
            for i, raw in enumerate(others)
            if (e := _entry(raw, f"status.otherDeployments[{i}]")) is not None
        ),
        spec_image=(
            _text(spec_image.get("image"), "spec.image.image")
            if isinstance(spec_image, dict)
            else None
        ),
    )


def parse_bootc_status(data: bytes) -> BootcHost:
    """`bootc status` output (JSON with --format json, YAML when piped) to a BootcHost."""
    return bootc_host_from_object(load_document(data))
