"""From (current config, desired config, host facts) to a verdict and ordered steps (pure).

Verdicts: `none` (nothing to do), `live` (allowlisted writes only: never a drain for the
built-in list, never a reboot), `image` (stage a digest-pinned image, drain, reboot), `refused`
(Unreconcilable, or content that needs an image nobody built)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from agent.core.policy import (
    BUILTIN_POLICY,
    CLOUD_CA,
    FORCED_MODES,
    KUBELET_CA,
    MIRRORS,
    SECRET_PATHS,
    SHADOW_PATH,
    SSH_KEYS_PATH,
    USER_CA_BUNDLE,
    Action,
    LivePolicy,
    requires_drain,
)
from agent.core.reconcile import unreconcilable_reasons
from agent.model.diff import ConfigDiff, core_user, diff_configs, ssh_keys_of
from agent.model.ignition import FileEntry, Owner
from agent.model.imageref import ImageRef
from agent.model.machineconfig import MachineConfig, empty_machine_config

NEVER_DELETED = frozenset({KUBELET_CA, CLOUD_CA, USER_CA_BUNDLE})  # as the MCD's deleteStaleData
CORE = Owner(name="core")
IMAGE_CATEGORIES = ("files", "units", "osImageURL", "kernelArguments", "extensions", "kernelType")

# The last reason of a refusal for image content; a source with its own way to name an image
# (HyperShift: NodePool.spec.config) says it in its place.
IMAGE_BUILD_HINT = (
    "these changes are image content and need an image build: build an OS image that contains "
    "them and set osImageURL to its digest-pinned reference"
)


@dataclass(frozen=True)
class LiveStep:
    path: str
    action: str  # "write" | "delete"
    then: tuple[str, ...] = ()
    kind: str = "file"  # "file" | "ssh-keys" | "password"
    contents: bytes = field(default=b"", repr=False)
    mode: int = 0o644
    user: Owner = Owner()
    group: Owner = Owner()

    @property
    def secret(self) -> bool:
        return self.path in SECRET_PATHS

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "action": self.action, "then": list(self.then)}


@dataclass(frozen=True)
class Plan:
    verdict: str
    reboot: bool = False
    drain: bool = False
    target_image: str | None = None
    live: tuple[LiveStep, ...] = ()
    image_changes: tuple[str, ...] = ()
    reasons: tuple[str, ...] = ()

    @property
    def follow_ups(self) -> tuple[str, ...]:
        """Follow-up actions of all live steps, each once, in first-seen order; a restart of a
        unit makes its reload redundant (as the MCD's restart-crio overrides reload-crio)."""
        actions = dict.fromkeys(a for step in self.live for a in step.then)
        restarted = {a.removeprefix("restart ") for a in actions if a.startswith("restart ")}
        return tuple(a for a in actions if a.removeprefix("reload ") not in restarted)

    def summary(self) -> str:
        """The plan in a line: why, then how many live files it checks. The live files are
        counted, not listed here: which of them change is known only at the write
        (`live_summary`), and a list cut at a few names hides the one that did."""
        parts = [r for r in self.reasons if not r.startswith("live: ")][:3]
        if self.live:
            parts.append(f"{len(self.live)} live file(s) to bring to the config")
        return "; ".join(parts)

    def to_json(self) -> dict[str, Any]:
        return {
            "verdict": self.verdict,
            "reboot": self.reboot,
            "drain": self.drain,
            "target_image": self.target_image,
            "live": [step.to_json() for step in self.live],
            "image_changes": list(self.image_changes),
            "reasons": list(self.reasons),
        }

    def render_text(self) -> str:
        disruption = ", ".join(
            [("reboot" if self.reboot else "no reboot"), ("drain" if self.drain else "no drain")]
        )
        lines = [f"verdict: {self.verdict} ({disruption})"]
        lines.append(f"target image: {self.target_image or '-'}")
        if self.live:
            lines.append("live steps:")
            for step in self.live:
                then = f"  then: {', '.join(step.then)}" if step.then else ""
                lines.append(f"  {step.action} {step.path}{then}")
        if self.image_changes:
            lines.append(f"image changes: {', '.join(self.image_changes)}")
        if self.reasons:
            lines.append("reasons:")
            lines.extend(f"  - {reason}" for reason in self.reasons)
        return "\n".join(lines)


def live_summary(plan: Plan, changed: Iterable[LiveStep]) -> str:
    """What the live part of `plan` did, once it has run (`changed`: the steps that changed
    the host; the others were as wanted already), and what happens next."""
    done = [f"{step.action} {step.path}" for step in changed]
    unchanged = len(plan.live) - len(done)
    if done:
        text = f"applied {len(done)} live change(s): {_summarize(done)}"
        if unchanged:
            text += f"; {unchanged} already as desired"
    else:
        text = f"live files already as desired ({unchanged}): nothing written"
    if plan.verdict == "image":
        return f"{text}; next: stage {plan.target_image}, then reboot into it"
    if plan.verdict == "live":
        return f"{text}; no reboot"
    return text


def _render(actions: Iterable[Action]) -> tuple[str, ...]:
    return tuple(a.render() for a in actions if a.kind not in ("Drain", "None"))


def _file_steps(entry: FileEntry, actions: tuple[Action, ...]) -> list[LiveStep]:
    paths = (entry.path, *MIRRORS.get(entry.path, ()))
    return [
        LiveStep(
            path=path,
            action="write",
            then=_render(actions) if path == entry.path else (),
            contents=entry.contents,
            mode=FORCED_MODES.get(path, entry.mode),
            user=entry.user,
            group=entry.group,
        )
        for path in paths
    ]


def _summarize(paths: Iterable[str], limit: int = 5) -> str:
    items = list(paths)
    shown = ", ".join(items[:limit])
    return shown + (f" and {len(items) - limit} more" if len(items) > limit else "")


@dataclass
class _Split:
    live: list[LiveStep] = field(default_factory=list)
    actions: list[Action] = field(default_factory=list)
    image_files: list[str] = field(default_factory=list)
    image_units: list[str] = field(default_factory=list)


def _split_changes(
    current: MachineConfig, desired: MachineConfig, diff: ConfigDiff, policy: LivePolicy
) -> _Split:
    split = _Split()
    new_files = desired.ignition.files
    for path in diff.files_changed:
        actions = policy.file_actions(path)
        if actions is None:
            split.image_files.append(path)
            continue
        split.live.extend(_file_steps(new_files[path], actions))
        split.actions.extend(actions)
    for path in diff.files_removed:
        actions = policy.file_actions(path)
        if actions is None:
            split.image_files.append(path)
        elif path not in NEVER_DELETED:
            for target in (path, *MIRRORS.get(path, ())):
                then = _render(actions) if target == path else ()
                split.live.append(LiveStep(path=target, action="delete", then=then))
            split.actions.extend(actions)
    _split_units(current, desired, diff, policy, split)
    if diff.ssh_keys:
        keys = ssh_keys_of(desired.ignition.users)
        contents = "".join(f"{key}\n" for key in keys).encode()
        split.live.append(
            LiveStep(
                path=SSH_KEYS_PATH,
                action="write",
                then=_render(policy.sshkey),
                kind="ssh-keys",
                contents=contents,
                mode=0o600,
                user=CORE,
                group=CORE,
            )
        )
        split.actions.extend(policy.sshkey)
    if diff.password:
        core = core_user(desired.ignition.users)
        split.live.append(
            LiveStep(
                path=SHADOW_PATH,
                action="write",
                kind="password",
                contents=((core.password_hash if core else None) or "*").encode(),
            )
        )
    return split


def _split_units(
    current: MachineConfig,
    desired: MachineConfig,
    diff: ConfigDiff,
    policy: LivePolicy,
    split: _Split,
) -> None:
    old_units, new_units = current.ignition.units, desired.ignition.units
    for name in (*diff.units_changed, *diff.units_removed):
        actions = policy.unit_actions(name)
        old, new = old_units.get(name), new_units.get(name)
        # Enablement and masking are the image's business (presets); only contents go live.
        state = (old.enabled, old.mask) if old else (None, None)
        if actions is None or state != ((new.enabled, new.mask) if new else (None, None)):
            split.image_units.append(name)
            continue
        base = f"/etc/systemd/system/{name}"
        then = _render(actions)
        if new is None or new.contents is None:
            split.live.append(LiveStep(path=base, action="delete", then=then))
        else:
            split.live.append(
                LiveStep(path=base, action="write", then=then, contents=new.contents.encode())
            )
        old_dropins = {d.name: d for d in (old.dropins if old else ())}
        new_dropins = {d.name: d for d in (new.dropins if new else ())}
        for dname in sorted(old_dropins.keys() | new_dropins.keys()):
            path = f"{base}.d/{dname}"
            dropin = new_dropins.get(dname)
            if dropin is None or not dropin.contents:
                if dname in old_dropins:
                    split.live.append(LiveStep(path=path, action="delete", then=then))
            elif old_dropins.get(dname) != dropin:
                contents = dropin.contents.encode()
                split.live.append(LiveStep(path=path, action="write", then=then, contents=contents))
        split.actions.extend(actions)


def live_changes(
    current: MachineConfig, desired: MachineConfig, policy: LivePolicy = BUILTIN_POLICY
) -> tuple[LiveStep, ...]:
    """Only the live steps from `current` to `desired` (used to undo an update's live part)."""
    diff = diff_configs(current, desired)
    return tuple(_split_changes(current, desired, diff, policy).live)


def plan_update(
    current: MachineConfig | None,
    desired: MachineConfig,
    *,
    booted: ImageRef | None,
    target: ImageRef | None,
    policy: LivePolicy = BUILTIN_POLICY,
    failed_digests: frozenset[str] = frozenset(),
    rewrite_live: bool = False,
) -> Plan:
    """Decide how to reach `desired`. `current=None` is a first start: the booted image is taken
    to carry the desired image content, so only the live part is applied. `rewrite_live`: the
    current config is only what the cluster says (adopted, never written on this host), so it
    decides what is refused and what is image content, but every live file of `desired` is
    written, as on a first start."""
    first_start = current is None
    baseline = desired if first_start else current
    assert baseline is not None
    refusals = unreconcilable_reasons(baseline, desired)
    target_text = str(target) if target else None
    if refusals:
        head = f"can't reconcile config {baseline.name or '(current)'} with {desired.name}"
        return Plan(
            "refused", target_image=target_text, reasons=tuple(f"{head}: {r}" for r in refusals)
        )

    live_base = empty_machine_config() if first_start or rewrite_live else baseline
    diff = diff_configs(live_base, desired)
    split = _split_changes(live_base, desired, diff, policy)
    if rewrite_live and not first_start:
        image_diff = diff_configs(baseline, desired)
        image_split = _split_changes(baseline, desired, image_diff, policy)
        split.image_files, split.image_units = image_split.image_files, image_split.image_units
        written = {step.path for step in split.live}  # what the baseline loses goes too
        split.live.extend(step for step in image_split.live if step.path not in written)
        diff = image_diff
    categories: list[str] = []
    reasons: list[str] = []
    if not first_start:
        if split.image_files:
            categories.append("files")
            reasons.append(
                f"files changed outside the live allowlist: {_summarize(split.image_files)}"
            )
        if split.image_units:
            categories.append("units")
            reasons.append(f"units changed: {_summarize(split.image_units)}")
        for flag, name in (
            (diff.kernel_arguments, "kernelArguments"),
            (diff.extensions, "extensions"),
            (diff.kernel_type, "kernelType"),
        ):
            if flag:
                categories.append(name)
                reasons.append(f"{name} changed")

    image_differs = target is not None and not target.same_image(booted)
    if image_differs:
        assert target is not None
        if not target.pinned:
            return Plan(
                "refused",
                target_image=target_text,
                image_changes=tuple(["osImageURL", *categories]),
                reasons=(
                    f"target image {target} is not pinned by digest: image mode stages only "
                    "name@sha256:<digest> references",
                    *reasons,
                ),
            )
        if target.digest in failed_digests:
            return Plan(
                "refused",
                target_image=target_text,
                image_changes=tuple(["osImageURL", *categories]),
                reasons=(
                    f"target image {target} failed on this host before and is not staged again "
                    "until the desired state changes",
                ),
            )
        reasons.insert(0, f"OS image changes from {booted or 'unknown'} to {target}")
        reasons.extend(f"live: {step.action} {step.path}" for step in split.live)
        return Plan(
            "image",
            reboot=True,
            drain=True,
            target_image=target_text,
            live=tuple(split.live),
            image_changes=tuple(["osImageURL", *categories]),
            reasons=tuple(reasons),
        )
    if categories:
        return Plan(
            "refused",
            target_image=target_text,
            live=(),
            image_changes=tuple(categories),
            reasons=(
                *reasons,
                IMAGE_BUILD_HINT,
            ),
        )
    if split.live:
        return Plan(
            "live",
            drain=requires_drain(split.actions),
            target_image=target_text,
            live=tuple(split.live),
            reasons=tuple(f"live: {step.action} {step.path}" for step in split.live),
        )
    return Plan("none", target_image=target_text, reasons=("no changes",))
