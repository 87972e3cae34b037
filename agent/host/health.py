"""Admin health checks: the files in `etc/image-mode-agent/check/{required,wanted}.d` under the
host root (greenboot's layout), run in name order. Every required check must pass; a wanted one
only warns.

Every regular file there whose name does not start with "." is a check, executable or not: a
file that is not executable fails (`not executable (mode 0644): chmod +x it or remove it`) rather
than being skipped, so that a required check whose `chmod +x` was forgotten fails the boot
instead of leaving the admin believing the boot is gated by it. Dotfiles (such as an editor's
`.name.swp`) and subdirectories are not checks."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable
from pathlib import Path

from agent.host.ports import HealthPort
from agent.model.checks import CheckReport, CheckResult

CHECK_DIR = "etc/image-mode-agent/check"


class CheckRunner:
    def __init__(self, root: Path, timeout: float = 60.0) -> None:
        self.root = Path(root)
        self.timeout = timeout

    def _checks(self, kind: str) -> list[Path]:
        folder = self.root / CHECK_DIR / f"{kind}.d"
        if not folder.is_dir():
            return []
        return sorted(p for p in folder.iterdir() if p.is_file() and not p.name.startswith("."))

    async def _run(self, path: Path, required: bool) -> CheckResult:
        if not os.access(path, os.X_OK):
            try:
                mode = path.stat().st_mode & 0o7777
            except OSError as exc:  # removed since the folder was listed
                return CheckResult(path.name, required, False, f"cannot run: {exc.strerror}")
            detail = f"not executable (mode {mode:04o}): chmod +x it or remove it"
            return CheckResult(path.name, required, False, detail)
        env = {**os.environ, "IMAGE_MODE_AGENT_ROOT": str(self.root)}
        try:
            proc = await asyncio.create_subprocess_exec(
                str(path),
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
                stdin=asyncio.subprocess.DEVNULL,
                env=env,
            )
        except OSError as exc:
            return CheckResult(path.name, required, False, f"cannot run: {exc.strerror}")
        try:
            async with asyncio.timeout(self.timeout):
                output, _ = await proc.communicate()
        except TimeoutError:
            proc.kill()
            await proc.wait()
            return CheckResult(path.name, required, False, f"timed out after {self.timeout:g}s")
        lines = output.decode(errors="replace").strip().splitlines()
        detail = lines[-1][:200] if lines else ""
        if proc.returncode == 0:
            return CheckResult(path.name, required, True, detail)
        return CheckResult(path.name, required, False, f"exit {proc.returncode}: {detail}".strip())

    async def run_checks(self) -> CheckReport:
        results = [await self._run(p, True) for p in self._checks("required")]
        results += [await self._run(p, False) for p in self._checks("wanted")]
        return CheckReport(tuple(results))


class WithExtraChecks:
    """A health port plus more required checks (e.g. the Node is Ready, in cluster mode)."""

    def __init__(self, inner: HealthPort, *extra: Callable[[], Awaitable[CheckResult]]) -> None:
        self.inner, self.extra = inner, extra

    async def run_checks(self) -> CheckReport:
        report = await self.inner.run_checks()
        results = [await check() for check in self.extra]
        return CheckReport((*report.results, *results))
