"""host/units.run_process: a deadline kills the whole process group and keeps what was read;
a cancelled call (the agent stopped mid-command) leaves nothing unretrieved behind."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from agent.host.units import run_process


async def test_output_and_status() -> None:
    result = await run_process(["sh", "-c", "echo out; echo err >&2; exit 3"], 10)
    assert (result.status, result.stdout, result.stderr) == (3, b"out\n", b"err\n")


async def test_deadline_kills_and_keeps_what_was_read() -> None:
    result = await run_process(["sh", "-c", "echo started; sleep 30"], 0.5)
    assert result.status is None and result.stdout == b"started\n"


async def test_a_grandchild_holding_the_pipes_does_not_hold_the_call() -> None:
    result = await run_process(["sh", "-c", "echo said; setsid sleep 6 &"], 30)
    assert result.status == 0 and result.stdout == b"said\n"


def test_cancelled_while_a_grandchild_holds_the_pipes(tmp_path: Path) -> None:
    """A child in another session keeps the pipes open after the group is killed, and the
    agent's loop ends (SIGTERM) before it does: nothing is reported at exit (no "exception was
    never retrieved", no unclosed transport)."""
    script = textwrap.dedent("""
        import asyncio, os, sys
        from agent.host.units import run_process
        async def main():
            up = sys.argv[1]  # the child makes it once the grandchild runs
            task = asyncio.create_task(run_process(
                ["sh", "-c", 'setsid sleep 3 & touch "$0"; sleep 30', up], 60))
            async with asyncio.timeout(20):
                while not os.path.exists(up):
                    await asyncio.sleep(0.02)
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                print("cancelled")
        asyncio.run(main())
    """)
    done = subprocess.run([sys.executable, "-c", script, str(tmp_path / "up")],
                          capture_output=True, text=True, timeout=30,
                          cwd=Path(__file__).resolve().parents[1])  # fmt: skip
    assert done.stdout == "cancelled\n" and done.returncode == 0
    assert done.stderr == ""
