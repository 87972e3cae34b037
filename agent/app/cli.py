"""Command line: the parser and main(); `plan` is in cmd_plan.py, `run` and `verify` in cmd_run.py.

`sim` and `demo` are here: only this module and runtime.py may load a stand-in (standins/), and
only inside the function that needs it."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from agent import __version__
from agent.app.cmd_plan import cmd_plan
from agent.app.cmd_run import cmd_run, cmd_verify
from agent.errors import HostError, InputError

EXIT_USAGE = 2


def _slots(text: str) -> str:
    """`--prestage-slots`: auto, unbounded, or a whole number >= 1."""
    if text in ("auto", "unbounded") or (text.isdigit() and int(text) >= 1):
        return text
    raise argparse.ArgumentTypeError(f"expected auto, unbounded or a number >= 1, got {text!r}")


def _lease_seconds(text: str) -> int:
    """`--prestage-lease-seconds`: renewed every third, so at least 3 whole seconds."""
    if text.isdigit() and int(text) >= 3:
        return int(text)
    raise argparse.ArgumentTypeError(f"expected whole seconds >= 3, got {text!r}")


def cmd_sim(args: argparse.Namespace) -> int:
    # The simulated host is not part of the agent: its command is reached only from here.
    from standins.cli import sim_main

    return sim_main(args.sim_args)


def cmd_status(args: argparse.Namespace) -> int:
    path = Path(args.state_dir) / "status.json"
    try:
        print(path.read_text(), end="")
    except OSError as exc:
        raise InputError(f"no status yet: {exc.strerror}", source=str(path)) from None
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from standins.demo.files import run_demo

    return run_demo(keep=args.keep, file_mode=args.file_mode)


def _host_flags(parser: argparse.ArgumentParser) -> None:
    local = parser.add_argument_group("real host (--host local)")
    local.add_argument("--host-root", default="/", help="the host's / (in a pod: /rootfs)")
    local.add_argument("--bootc", default="bootc", help="the bootc executable")
    local.add_argument(
        "--bootc-prefix",
        default="",
        help="command prefix to reach the host, e.g. 'nsenter -t 1 -m -u -i -n -p --' in a pod",
    )
    local.add_argument("--bus-address", help="D-Bus address (default: the system bus)")
    local.add_argument(
        "--kubelet-healthz",
        help="after a boot, also require this URL to answer 200 "
        "(cluster nodes: http://localhost:10248/healthz)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="image-mode-agent",
        description="Node agent of image-mode OpenShift: live allowlisted config, bootc images.",
    )
    parser.add_argument("--log-level", default="info", help="debug, info, warning, error")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    plan = sub.add_parser("plan", help="verdict and steps for a change from one config to another")
    plan.add_argument("--current", required=True, help="current MachineConfig (YAML or JSON)")
    plan.add_argument("--desired", required=True, help="desired MachineConfig (YAML or JSON)")
    plan.add_argument("--booted-image", help="booted image (default: current spec.osImageURL)")
    plan.add_argument("--desired-image", help="target image (default: desired spec.osImageURL)")
    plan.add_argument("--output", choices=("text", "json"), default="text")
    plan.add_argument(
        "--policy", help="MachineConfiguration/cluster whose NodeDisruptionPolicy status extends "
        "the live allowlist",
    )  # fmt: skip
    plan.set_defaults(func=cmd_plan)

    run = sub.add_parser("run", help="reconcile a host toward its desired state")
    run.add_argument(
        "--source",
        required=True,
        help="file:PATH (a MachineConfig document), image:REF (follow a tag: no cluster), "
        "kube (the Node) or hypershift (the Node in a hosted cluster's InPlace NodePool)",
    )
    run.add_argument("--host", required=True, help="simulated:DIR or local")
    run.add_argument("--once", action="store_true", help="exit 0 Done, 3 rebooting, 4 Degraded")
    run.add_argument("--dry-run", action="store_true", help="observe and plan, change nothing")
    run.add_argument("--image", help="target image instead of the document's spec.osImageURL")
    run.add_argument("--max-boot-attempts", type=int, default=1,
                     help="boots of a new image whose checks fail before rolling back")  # fmt: skip
    run.add_argument(
        "--allow-soft-reboot",
        action="store_true",
        help="soft-reboot into a staged image that bootc marks softRebootCapable",
    )
    run.add_argument(
        "--listen",
        default="127.0.0.1:8797",
        help="HOST:PORT of /healthz, /readyz, /metrics, /status ('' to turn off)",
    )
    run.add_argument("--poll-interval", type=float, default=1.0, help="seconds between checks "
                     "of the source file")  # fmt: skip
    run.add_argument(
        "--policy",
        help="file mode: a MachineConfiguration/cluster whose NodeDisruptionPolicy status "
        "extends the live allowlist (read on every pass)",
    )
    run.add_argument(
        "--etc-drift-ignore", action="append", metavar="GLOB",
        help="an /etc path (fnmatch glob) the host may change from the image's default "
        "without it being reported as drift; repeatable, added to the built-in list",
    )  # fmt: skip
    standalone = run.add_argument_group(
        "standalone mode (--source image:REF; flags override the settings drop-ins)"
    )
    standalone.add_argument(
        "--settings-dir",
        action="append",
        metavar="DIR",
        help="a directory of *.toml drop-ins, repeatable, later wins (default: "
        "/usr/lib, /etc, /run .../image-mode-agent/config.d)",
    )
    standalone.add_argument(
        "--config", metavar="file:PATH", help="a MachineConfig whose live part is applied"
    )
    standalone.add_argument(
        "--strategy",
        choices=("immediate", "periodic", "fleet_lock", "fleetlock"),
        help="when a staged image may be rebooted into (default: immediate)",
    )
    standalone.add_argument(
        "--check-interval", type=float, help="seconds between checks of the tag (default 300)"
    )
    standalone.add_argument("--time-zone", help="periodic: the windows' zone (default UTC)")
    standalone.add_argument("--fleet-lock-url", help="fleet_lock: the FleetLock server's base URL")
    standalone.add_argument("--group", help="fleet_lock: this host's reboot group")
    cluster = run.add_argument_group("cluster mode (--source kube)")
    cluster.add_argument("--kubeconfig", help="credentials for reads (default: in-cluster)")
    cluster.add_argument(
        "--node-kubeconfig", help="credentials for writing the own Node (the kubelet's)"
    )
    cluster.add_argument("--node-name", help="this node's name (default: $NODE_NAME)")
    cluster.add_argument(
        "--drain",
        choices=("controller", "self"),
        default="controller",
        help="who drains: the MCO drain controller (handshake) or the agent itself",
    )
    cluster.add_argument("--drain-timeout", type=float, default=3600.0, help="seconds")
    cluster.add_argument(
        "--prestage",
        choices=("pool", "off"),
        default="pool",
        help="stage the pool's (NodePool's) target image locked before this node's turn "
        "(default: pool)",
    )
    cluster.add_argument(
        "--prestage-slots",
        type=_slots,
        default="auto",
        metavar="auto|K|unbounded",
        help="pre-pulls at once per pool or NodePool, through Lease lanes in the order the "
        "controller (the upgrader) picks the Nodes: auto (default) = the pool's maxUnavailable; "
        "with --source hypershift 1 (a node cannot read the NodePool's maxUnavailable: give it "
        "as K); unbounded = every node after --prestage-jitter",
    )
    cluster.add_argument(
        "--prestage-jitter",
        type=float,
        default=60.0,
        help="seconds; unbounded pre-pulls only (--prestage-slots unbounded, or, in either "
        "mode, the fallback when RBAC refuses the lanes, said by a PrestageUnbounded Event): a "
        "pre-stage starts after a random delay up to this. Bounded ones start when their lane "
        "is free",
    )
    cluster.add_argument(
        "--prestage-lease-namespace",
        default="openshift-machine-config-operator",
        help="namespace of the pre-pull lanes' Leases (RBAC: deploy/rbac.yaml); with --source "
        "hypershift they are in the upgrade namespace (deploy/hypershift/rbac.yaml)",
    )
    cluster.add_argument(
        "--prestage-lease-seconds",
        type=_lease_seconds,
        default=30,
        help="a pre-pull lane's lease: renewed every third, taken over after it runs out",
    )
    cluster.add_argument(
        "--prestage-retry",
        type=float,
        default=10.0,
        help="seconds before the first retry of a failed pre-stage (doubling, up to 600)",
    )
    hypershift = run.add_argument_group(
        "HyperShift InPlace NodePool (--source hypershift; also --kubeconfig: the kubelet's, "
        "--node-name, --drain-timeout, --prestage*)"
    )
    hypershift.add_argument(
        "--upgrade-namespace",
        help="namespace of the NodePool's upgrade ConfigMap (default: <np>-upgrade, np from "
        "the Node's label hypershift.openshift.io/nodePool)",
    )
    hypershift.add_argument(
        "--upgrade-configmap", help="the upgrade ConfigMap's name (default: <np>-upgrade)"
    )
    hypershift.add_argument(
        "--refused-retry",
        type=float,
        default=60.0,
        help="seconds a refused NodePool config holds the NodePool before the agent lifts its "
        "Degraded to let the upgrader publish a new target",
    )
    run.set_defaults(func=cmd_run)
    _host_flags(run)

    verify = sub.add_parser(
        "verify", help="boot-time check of a new image: commit it, or roll back and reboot"
    )
    verify.add_argument("--host", default="local", help="local (default) or simulated:DIR")
    verify.add_argument("--max-boot-attempts", type=int, default=1)
    verify.add_argument("--kubeconfig", help="cluster mode: the Node must also report Ready")
    verify.add_argument("--node-name", help="this node's name (default: $NODE_NAME)")
    verify.add_argument("--node-ready-deadline", type=float, default=600.0, help="seconds")
    verify.set_defaults(func=cmd_verify)
    _host_flags(verify)

    # `sim` has its own parser (standins/cli.py), loaded only when it runs.
    sim = sub.add_parser("sim", help="create and drive a simulated host", add_help=False)
    sim.add_argument("sim_args", nargs=argparse.REMAINDER)
    sim.set_defaults(func=cmd_sim)

    status = sub.add_parser("status", help="print the agent's last reported status")
    status.add_argument("--state-dir", default="/var/lib/image-mode-agent")
    status.set_defaults(func=cmd_status)

    demo = sub.add_parser("demo", help="a timeline on a throwaway simulated host")
    demo.add_argument("--keep", action="store_true", help="keep the simulated host directory")
    demo.add_argument("--file-mode", action="store_true", help="no cluster: the agent reads a file")
    demo.set_defaults(func=cmd_demo)
    return parser


def main(argv: list[str] | None = None) -> int:
    from agent.observe.logging import configure_logging

    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if getattr(args, "func", None) is cmd_sim:
        args.sim_args = extra + args.sim_args  # `sim --help` is the simulated host's
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    configure_logging(args.log_level)
    try:
        return int(args.func(args))
    except InputError as exc:
        print(f"image-mode-agent: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except HostError as exc:
        print(f"image-mode-agent: host error ({exc.kind}): {exc}", file=sys.stderr)
        return 4
    except KeyboardInterrupt:
        return 130
