"""The MCD's on-disk config on this host, read to take a node over and written to hand it
back (formats in model/mcd_disk.py): the agent takes the MCD's `currentconfig` as the current
config (the MCD's own rule, "disk is truth"), and writes it, with `currentimage`, just before
each of its updates becomes current, so an MCD started on the node later finds the config and
image the node really has."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from agent.errors import HostError, InputError
from agent.host.ports import FilesPort
from agent.model.ignition import Owner
from agent.model.mcd_disk import (
    CURRENT_CONFIG_PATH,
    CURRENT_IMAGE_PATH,
    config_document,
    on_disk_config,
    on_disk_image,
    read_image,
)

# The MCD writes both 0644 (writeFileAtomicallyWithDefaults), though currentconfig holds the
# pull secret and the password hash of the config: this agent writes that one 0600. The MCD
# reads it as root and replaces the file (and its mode) at its own next update. currentimage
# names an image, nothing secret: 0644 as the MCD's, so its mode is the same whoever wrote it.
MODE = 0o600
IMAGE_MODE = 0o644
_ROOT = Owner(id=0)


class McdRecord:
    def __init__(self, files: FilesPort) -> None:
        self.files = files

    def config(self) -> tuple[bytes, str] | None:
        """The current config the MCD recorded, as a document the engine records, and the
        file's path; None when there is none. A file that is no MachineConfig is HostError
        kind `journal` naming it, as an unreadable record of the agent's own is."""
        data = self.files.read(CURRENT_CONFIG_PATH)
        if data is None:
            return None
        try:
            return config_document(data), CURRENT_CONFIG_PATH
        except InputError as exc:
            raise HostError(f"recorded config {exc}", kind="journal") from None

    def image(self) -> str | None:
        return read_image(self.files.read(CURRENT_IMAGE_PATH))

    def write(self, rendered: Mapping[str, Any] | None, document: bytes, image: str | None) -> bool:
        """Record `rendered` (the API server's object; or else the engine's `document`) and
        `image` as the MCD would; nothing is written when both files say so already.
        Returns whether anything was written."""
        source = dict(rendered) if rendered is not None else json.loads(document)
        config, image_bytes = on_disk_config(source), on_disk_image(image)
        wrote = False
        if not self._same(config):
            self.files.write(CURRENT_CONFIG_PATH, config, mode=MODE, user=_ROOT, group=_ROOT)
            wrote = True
        if self.files.read(CURRENT_IMAGE_PATH) != image_bytes:
            self.files.write(CURRENT_IMAGE_PATH, image_bytes, mode=IMAGE_MODE, user=_ROOT,
                             group=_ROOT)  # fmt: skip
            wrote = True
        return wrote

    def _same(self, config: bytes) -> bool:
        """Whether the file holds `config` already (the same config, whatever metadata the
        MCD's copy of it carries, e.g. an older resourceVersion)."""
        data = self.files.read(CURRENT_CONFIG_PATH)
        if data is None:
            return False
        try:
            return config_document(data) == config_document(config)
        except InputError:
            return False
