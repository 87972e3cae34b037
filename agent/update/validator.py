"""On-disk validation through the host ports: gathers what core/validate.py compares (files,
unit file states, the booted image, ostree's view of /etc) and keeps the last result.

It reads and never writes; a fact the host cannot give is a finding or, for the /etc diff on a
host with no ostree, a note, never a crash of the pass."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

import structlog

from agent.core.policy import LivePolicy
from agent.core.validate import (
    Expectations,
    FileFacts,
    Finding,
    HostFacts,
    expectations,
    findings,
)
from agent.errors import HostError, InputError
from agent.host.ports import Host
from agent.model.etc_drift import DEFAULT_ETC_IGNORE, EtcChange, parse_config_diff
from agent.model.imageref import parse_image_ref
from agent.model.machineconfig import MachineConfig


@dataclass(frozen=True)
class Validation:
    """One validation: when, against which config, and what differed."""

    at: float
    against: str
    found: tuple[Finding, ...] = ()
    notes: tuple[str, ...] = ()  # what could not be checked, and why
    booted_digest: str | None = None

    @property
    def ok(self) -> bool:
        return not self.found

    def blocking(self, *, image_changes: bool) -> tuple[Finding, ...]:
        """The findings an update must not go past. A booted image other than the recorded
        one does not stop an update that stages a new image anyway (the plan starts from the
        booted image, not from the record): that update ends the drift."""
        return tuple(f for f in self.found if not (image_changes and f.kind == "image"))

    def to_json(self) -> dict[str, Any]:
        return {
            "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.at)),
            "against": self.against,
            "ok": self.ok,
            "findings": [f.to_json() for f in self.found],
            "notes": list(self.notes),
        }


class Validator:
    def __init__(self, host: Host, *, etc_ignore: tuple[str, ...] = DEFAULT_ETC_IGNORE) -> None:
        self.host = host
        self.etc_ignore = etc_ignore
        self.last: Validation | None = None
        self.log = structlog.get_logger("validate")

    @staticmethod
    def expected(config: MachineConfig, policy: LivePolicy, image: str | None) -> Expectations:
        """What `config` makes the host hold, booted into `image` (a digest-pinned
        reference; None, or a tag, when no image is recorded: nothing to compare)."""
        digest = None
        if image:
            try:
                digest = parse_image_ref(image).digest
            except InputError:
                digest = None
        return expectations(config, policy, image if digest else None, digest)

    async def validate(self, expected: Expectations) -> Validation:
        """The host against `expected`."""
        notes: list[str] = []
        errors: dict[str, str] = {}
        status = await self.host.bootc.status()
        facts = HostFacts(
            files=await asyncio.to_thread(self._files, expected, errors),
            file_errors=errors,
            owners=await asyncio.to_thread(self._owners, expected),
            units={u.name: await self.host.system.unit_file_state(u.name) for u in expected.units},
            booted_digest=status.booted_digest,
            booted_image=status.booted_ref,
            etc_changes=await self._etc_changes(notes),
        )
        found = findings(expected, facts, self.etc_ignore)
        result = Validation(time.time(), expected.config_name, found, tuple(notes),
                            status.booted_digest)  # fmt: skip
        self.last = result
        # Paths and wording only: findings never carry file contents.
        self.log.info("validated on-disk state", against=expected.config_name, ok=result.ok,
                      findings=[f.text for f in result.found][:10], notes=notes)  # fmt: skip
        return result

    def _files(self, expected: Expectations, errors: dict[str, str]) -> dict[str, FileFacts | None]:
        facts: dict[str, FileFacts | None] = {}
        for file in expected.files:
            try:
                facts[file.path] = self.host.files.inspect(file.path)
            except HostError as exc:
                errors[file.path] = str(exc)
        return facts

    def _owners(self, expected: Expectations) -> dict[str, tuple[int, int] | None]:
        owners: dict[str, tuple[int, int] | None] = {}
        for file in expected.files:
            try:
                owners[file.path] = self.host.files.owner_ids(file.user, file.group)
            except HostError:
                owners[file.path] = None  # an unknown owner: the update that writes it says so
        return owners

    async def _etc_changes(self, notes: list[str]) -> tuple[EtcChange, ...] | None:
        try:
            text = await self.host.bootc.config_diff()
        except HostError as exc:
            notes.append(f"/etc not compared with the image: {exc}")
            return None
        try:
            return parse_config_diff(text)
        except InputError as exc:
            notes.append(f"/etc not compared with the image: unreadable config-diff: {exc}")
            return None
