"""`run` and `verify`: the commands that open a host and drive it, until stopped or once."""

from __future__ import annotations

import argparse
import asyncio
import os
from pathlib import Path

from agent.core.policy import Allowlist
from agent.errors import InputError


def _local_options(args: argparse.Namespace):
    if args.host != "local":
        return None  # the real-host adapters (dbus-fast, aiohttp) load only for a real host
    from agent.host.local import LocalOptions

    return LocalOptions(
        root=Path(args.host_root),
        bootc=args.bootc,
        bootc_prefix=args.bootc_prefix,
        bus_address=args.bus_address,
        kubelet_url=args.kubelet_healthz,
    )


def cmd_run(args: argparse.Namespace) -> int:
    from agent.app.file_source import RunOptions, run_file_source
    from agent.app.kube_source import run_cluster_source, run_hypershift_source
    from agent.app.runtime import etc_ignore, host_root, open_host, until_signalled, watchdog

    kind, _, arg = args.source.partition(":")
    if not ((kind == "file" and arg) or args.source in ("kube", "hypershift") or kind == "image"):
        raise InputError(
            f"unknown source {args.source!r}: expected file:PATH, image:REF, kube or hypershift",
            field="--source",
        )
    follow = None
    if kind == "image":  # every bad setting fails here, before the host is touched
        from agent.app.standalone import build_strategy, load_follow_settings

        settings, image = load_follow_settings(arg, args.settings_dir, _follow_flags(args))
        follow = settings, image, build_strategy(settings, host_root(args.host, args.host_root))
    options = RunOptions(
        once=args.once,
        dry_run=args.dry_run,
        image_override=args.image,
        max_boot_attempts=args.max_boot_attempts,
        poll_interval=args.poll_interval,
        soft_reboot=args.allow_soft_reboot,
        policy_file=Path(args.policy) if args.policy else None,
        etc_ignore=etc_ignore(args.etc_drift_ignore),
    )

    async def main() -> int:
        from agent.observe.http import StatusBoard, serve

        allowlist = Allowlist()
        host = await open_host(args.host, allowlist, _local_options(args))
        board = StatusBoard()
        endpoints = None if args.dry_run and args.once else await serve(board, args.listen)
        beat = asyncio.create_task(watchdog())
        try:
            if follow is not None:
                from agent.app.standalone import run_follow_source

                settings, image, strategy = follow
                return await until_signalled(run_follow_source(
                    host, settings, image, strategy, board, once=args.once, dry_run=args.dry_run,
                    max_boot_attempts=args.max_boot_attempts,
                    soft_reboot=args.allow_soft_reboot,
                ))  # fmt: skip
            if args.source == "kube":
                return await run_cluster_source(host, allowlist, args, board)
            if args.source == "hypershift":
                return await run_hypershift_source(host, allowlist, args, board)
            return await run_file_source(Path(arg), host, options, board=board, allowlist=allowlist)
        finally:
            beat.cancel()
            if endpoints is not None:
                await endpoints.cleanup()

    return asyncio.run(main())


def _follow_flags(args: argparse.Namespace) -> dict[str, object]:
    """The standalone-mode flags that override the settings files (None: not given)."""
    config = args.config
    if config is not None:
        kind, _, path = config.partition(":")
        if kind != "file" or not path:
            raise InputError(f"expected file:PATH, got {config!r}", field="--config")
        config = str(Path(path).absolute())  # the service's working directory is not the shell's
    return {
        "interval": args.check_interval,
        "live_config": config,
        "strategy": args.strategy,
        "time_zone": args.time_zone,
        "fleet_lock_url": args.fleet_lock_url,
        "group": args.group,
    }


def cmd_verify(args: argparse.Namespace) -> int:
    from agent.app.runtime import open_host, run_verify

    async def main() -> int:
        host = await open_host(args.host, Allowlist(), _local_options(args))
        node = args.node_name or os.environ.get("NODE_NAME")
        return await run_verify(
            host, args.max_boot_attempts, args.kubeconfig, node, args.node_ready_deadline
        )

    return asyncio.run(main())
