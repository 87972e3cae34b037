"""`run --source image:REF`: settings (drop-ins, then flags), the strategy they name, and the
follow loop (agent/follow/) over a host."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agent.app.runtime import (
    announce_bootc,
    exit_code,
    journal_phase,
    metered_hooks,
    write_status,
)
from agent.errors import InputError
from agent.follow.agent import FollowAgent, FollowOptions
from agent.host.ports import Host
from agent.model.imageref import ImageRef, parse_image_ref
from agent.model.settings import FollowSettings
from agent.observe.http import StatusBoard
from agent.sources.settings_files import DEFAULT_DIRS, load_settings
from agent.strategy.base import Strategy
from agent.strategy.fleet_lock import FleetLockStrategy
from agent.strategy.immediate import ImmediateStrategy
from agent.strategy.periodic import PeriodicStrategy
from agent.update.engine import Engine, Outcome


def followed_image(text: str, where: str) -> ImageRef:
    """The tag to follow: a reference with a tag and no digest (a digest never moves)."""
    try:
        ref = parse_image_ref(text)
    except InputError as exc:
        raise InputError(exc.message, field=where) from None
    if ref.digest is not None:
        raise InputError(
            f"{text} is pinned by digest, so there is nothing to follow: name a tag, or use "
            "--source file:PATH for a fixed image",
            field=where,
        )
    if ref.tag is None:
        raise InputError(f"{text} names no tag: name the tag to follow, e.g. {text}:latest",
                         field=where)  # fmt: skip
    return ref


def load_follow_settings(
    source_arg: str, dirs: Sequence[str] | None, flags: dict[str, Any]
) -> tuple[FollowSettings, ImageRef]:
    """Drop-ins from `dirs` (default: /usr/lib, /etc, /run .../image-mode-agent/config.d),
    then the command line; the tag from `--source image:REF`, else `[follow] image`."""
    settings = load_settings(list(dirs) if dirs else DEFAULT_DIRS,
                             image=source_arg or None, **flags)  # fmt: skip
    if not settings.image:
        raise InputError("no image to follow: pass --source image:REF or set image in [follow]",
                         field="--source")  # fmt: skip
    where = "--source" if source_arg else f"{settings.source_of('follow.image')}: follow.image"
    return settings, followed_image(settings.image, where)


def build_strategy(settings: FollowSettings, host_root: Path) -> Strategy:
    """The strategy the settings name; InputError naming the key at fault."""
    if settings.strategy == "periodic":
        table = {"time_zone": settings.time_zone, "window": list(settings.windows)}
        try:
            return PeriodicStrategy.from_config(table, localtime=host_root / "etc/localtime")
        except InputError as exc:  # a window or the zone: name the file that set it
            raise exc.located(settings.source_of(exc.field) or exc.source) from None
    if settings.strategy == "fleet_lock":
        assert settings.fleet_lock_url is not None  # check_settings demands it
        return FleetLockStrategy.from_config(
            settings.fleet_lock_url, group=settings.group, node_uuid=settings.node_uuid,
            root=host_root,
        )  # fmt: skip
    return ImmediateStrategy()


async def run_follow_source(
    host: Host,
    settings: FollowSettings,
    image: ImageRef,
    strategy: Strategy,
    board: StatusBoard,
    *,
    once: bool = False,
    dry_run: bool = False,
    max_boot_attempts: int = 1,
    soft_reboot: bool = False,
) -> int:
    """Follow `image` on `host` until stopped (or once); the process exit code."""
    if not dry_run:
        await announce_bootc(host, board)
    engine = Engine(host, max_boot_attempts=max_boot_attempts,
                    hooks=metered_hooks(board.metrics), soft_reboot=soft_reboot)  # fmt: skip
    options = FollowOptions(
        image,
        interval=settings.interval,
        live_config=Path(settings.live_config) if settings.live_config else None,
        once=once,
        dry_run=dry_run,
    )

    def report(outcome: Outcome, extra: dict[str, Any]) -> None:
        if dry_run:  # as file mode's dry run: the plan and the verdict, nothing written
            if outcome.plan is not None:
                print(outcome.plan.render_text())
            print(f"{outcome.state}: {outcome.reason}" if outcome.reason else outcome.state)
        else:
            write_status(host, outcome, journal_phase(engine), board, extra)

    agent = FollowAgent(host, engine, strategy, options, report, board.metrics)
    try:
        return exit_code(await agent.run())
    finally:
        await agent.aclose()
