"""`plan`: the verdict and steps for a change from one MachineConfig file to another."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from agent.core.plan import plan_update
from agent.core.policy import BUILTIN_POLICY
from agent.errors import InputError
from agent.model.imageref import ImageRef, parse_image_ref
from agent.model.machineconfig import parse_machine_config
from agent.sources.disruption_policy import load_live_policy


def _read_file(path: str, what: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise InputError(f"cannot read: {exc.strerror}", source=path, field=what) from None


def _image_arg(text: str | None, flag: str) -> ImageRef | None:
    if not text:
        return None
    try:
        return parse_image_ref(text)
    except InputError as exc:
        raise InputError(exc.message, field=flag) from None


def cmd_plan(args: argparse.Namespace) -> int:
    try:
        current = parse_machine_config(_read_file(args.current, "--current"), "current")
    except InputError as exc:
        raise exc.located(args.current) from None
    try:
        desired = parse_machine_config(_read_file(args.desired, "--desired"), "desired")
    except InputError as exc:
        raise exc.located(args.desired) from None
    booted = _image_arg(args.booted_image, "--booted-image")
    if booted is None and current.os_image_url:
        booted = _image_arg(current.os_image_url, f"{args.current}: spec.osImageURL")
    target = _image_arg(args.desired_image, "--desired-image")
    if target is None and desired.os_image_url:
        target = _image_arg(desired.os_image_url, f"{args.desired}: spec.osImageURL")
    policy = load_live_policy(Path(args.policy)) if args.policy else BUILTIN_POLICY
    plan = plan_update(current, desired, booted=booted, target=target, policy=policy)
    if args.output == "json":
        print(json.dumps(plan.to_json(), indent=2))
    else:
        print(plan.render_text())
    return 0
