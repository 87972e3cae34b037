"""The desired state of a host that follows a tag: its live config (a local MachineConfig, or
none) and the digest the tag points to."""

from __future__ import annotations

import json
from pathlib import Path

from agent.core.desired import Desired
from agent.errors import parsing
from agent.model.imageref import ImageRef
from agent.model.machineconfig import parse_machine_config
from agent.sources.file import load_desired

# With no --config, the host's live part is empty: the engine records this as its config.
NO_LIVE_CONFIG = json.dumps(
    {
        "apiVersion": "machineconfiguration.openshift.io/v1",
        "kind": "MachineConfig",
        "metadata": {"name": "image-follow"},
        "spec": {},
    }
).encode()


def desired_state(live_config: Path | None, target: ImageRef | None) -> Desired:
    """The live config at `live_config` (InputError naming it when unusable) with `target` as
    the OS image: the followed tag decides the image, never the file's spec.osImageURL."""
    if live_config is None:
        return Desired(parse_machine_config(NO_LIVE_CONFIG), NO_LIVE_CONFIG, target)
    loaded = parsing(load_desired, live_config, None, source=str(live_config))
    return Desired(loaded.config, loaded.document, target)
