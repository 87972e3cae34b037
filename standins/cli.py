"""`image-mode-agent sim`: create a simulated host and drive its faults. The agent's command
line hands every `sim` argument here, so the agent never loads the simulated host itself."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from agent.errors import InputError
from standins.bootc_releases import DEFAULT_PERSONA, PERSONAS
from standins.host.simulated import SimulatedHost

SIM_HELP = """\
A simulated host is a directory: files under DIR/root, a bootc state machine (host.json) that
prints the real `bootc status` schema, a registry of images it can pull (registry.json), and a
log of unit actions and reboots (actions.log). Create one booted into an image, add images to
its registry (each add prints the digest-pinned reference to put in osImageURL, and moves the
tag to it), and point `image-mode-agent run --host simulated:DIR` at it:

  image-mode-agent sim create DIR --image quay.example/os/node:v1
  image-mode-agent sim add-image DIR quay.example/os/node:v2 --file usr/lib/os-release=v2
  image-mode-agent sim add-image DIR quay.example/os/node:v3 --boot-fails
  image-mode-agent sim disk-full DIR        (stages fail for lack of space; --off ends it)
  image-mode-agent sim registry-down DIR    (checks of a tag and pulls fail; --off ends it)
  image-mode-agent sim reboot-fails DIR     (reboot requests are refused; --off ends it)
  image-mode-agent sim rollback-fails DIR   (`bootc rollback` fails; --off ends it)
  image-mode-agent sim status DIR
"""


# The simulated host's faults that hold until `--off`: command -> (setter, on, off).
SIM_FAULTS = {
    "disk-full": ("set_disk_full", "stages fail on a full disk", "the disk has room again"),
    "registry-down": ("set_registry_down", "the registry answers nothing",
                      "the registry answers again"),
    "reboot-fails": ("set_reboot_fails", "reboot requests are refused",
                     "reboot requests succeed again"),
    "rollback-fails": ("set_rollback_fails", "`bootc rollback` fails",
                       "`bootc rollback` works again"),
}  # fmt: skip


def cmd_sim(args: argparse.Namespace) -> int:
    files = {}
    for item in getattr(args, "file", None) or []:
        rel, sep, text = item.partition("=")
        if not sep or rel.startswith("/") or ".." in rel.split("/"):
            raise InputError(f"expected RELATIVE/PATH=TEXT, got {item!r}", field="--file")
        files[rel] = text
    base = Path(args.dir)
    if args.sim_command == "create":
        sim = SimulatedHost.create(base, args.image, files, bootc_version=args.bootc_version)
        print(json.dumps(sim.status_document()["status"]["booted"]["image"], indent=2))
    elif args.sim_command == "add-image":
        sim = SimulatedHost(base)
        print(
            sim.add_image(
                args.ref,
                files,
                boot_fails=args.boot_fails,
                pull_seconds=args.pull_seconds,
                soft_reboot_capable=args.soft_reboot_capable,
                signed_by=tuple(args.signed_by or ()),
            )
        )
    elif args.sim_command == "next-boot-fails":
        SimulatedHost(base).set_next_boot_fails(True)
    elif args.sim_command in SIM_FAULTS:
        setter = getattr(SimulatedHost(base), SIM_FAULTS[args.sim_command][0])
        setter(not args.off)
    else:
        print(json.dumps(SimulatedHost(base).status_document(), indent=2))
    return 0


def build_sim_parser() -> argparse.ArgumentParser:
    sim = argparse.ArgumentParser(
        prog="image-mode-agent sim", description=SIM_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    sim_sub = sim.add_subparsers(dest="sim_command", required=True)
    create = sim_sub.add_parser("create", help="a new host booted into --image")
    create.add_argument("dir")
    create.add_argument("--image", required=True, help="registry/path:tag to boot")
    create.add_argument("--file", action="append", help="RELATIVE/PATH=TEXT the image ships")
    create.add_argument("--bootc-version", choices=PERSONAS, default=DEFAULT_PERSONA,
                        help="the bootc release the host runs")  # fmt: skip
    add = sim_sub.add_parser("add-image", help="add an image to the host's registry")
    add.add_argument("dir")
    add.add_argument("ref", help="registry/path:tag")
    add.add_argument("--file", action="append", help="RELATIVE/PATH=TEXT the image ships")
    add.add_argument("--boot-fails", action="store_true", help="its boots never complete")
    add.add_argument("--pull-seconds", type=float, default=0.0, help="how long a pull takes")
    add.add_argument(
        "--soft-reboot-capable", action="store_true", help="staged, it allows a soft reboot"
    )
    add.add_argument(
        "--signed-by",
        action="append",
        metavar="KEY_PATH",
        help="signed by the key policy.json names by this path (repeatable)",
    )
    fail = sim_sub.add_parser("next-boot-fails", help="the next boot falls back")
    fail.add_argument("dir")
    for name, (_, on, off) in SIM_FAULTS.items():
        fault = sim_sub.add_parser(name, help=f"{on} (until --off)")
        fault.add_argument("dir")
        fault.add_argument("--off", action="store_true", help=off)
    show = sim_sub.add_parser("status", help="print the host as `bootc status` would")
    show.add_argument("dir")
    return sim


def sim_main(argv: list[str]) -> int:
    """Run one `sim` command; errors as the agent's command line reports them (InputError)."""
    return cmd_sim(build_sim_parser().parse_args(argv))
