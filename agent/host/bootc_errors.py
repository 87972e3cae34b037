"""bootc's stderr to a `HostError` kind.

bootc has one failure exit code (1) and prints `error: <context chain>` on stderr, so the only way
to give distinct reasons (credentials vs a missing image vs a full disk vs a held lock) is the
text of that chain. The patterns come from containers-image / ostree messages bootc passes on."""

from __future__ import annotations

import re

from agent.errors import HostError

# Order matters: a chain can mention several things ("reading manifest ... : denied"), and the
# most specific, most actionable cause wins.
_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = (
    (
        "disk-space",
        re.compile(r"no space left on device|enospc|os error 28|insufficient free space", re.I),
    ),
    (
        # containers/image's policy verdicts ("Source image rejected: A signature was
        # required, but no signature exists", "... is rejected by policy", "Invalid GPG
        # signature") and ostree-ext's refusal of an insecure default under enforcement.
        "signature",
        re.compile(
            r"source image rejected|rejected by policy|signature|refusing usage|"
            r"insecureAcceptAnything",
            re.I,
        ),
    ),
    (
        "registry-auth",
        re.compile(
            r"\b(401|403)\b|unauthorized|authentication required|access denied|denied:|"
            r"requested access to the resource is denied|forbidden",
            re.I,
        ),
    ),
    (
        "image-missing",
        re.compile(r"manifest unknown|name unknown|\b404\b|not found|no such image", re.I),
    ),
    ("lock", re.compile(r"waiting for sysroot lock|sysroot lock", re.I)),
)

# Long enough for the interesting part of a chain, short enough for a 2000-char MCO reason.
MAX_MESSAGE = 1000


def error_lines(stderr: str) -> str:
    """The `error: ...` lines bootc printed (trimmed), else the last non-empty line."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    chosen = [line for line in lines if line.startswith("error:")]
    text = " ".join(chosen) if chosen else (lines[-1] if lines else "")
    return text[:MAX_MESSAGE]


def classify(stderr: str) -> str:
    """The HostError kind for a failed bootc call, from everything it printed on stderr."""
    for kind, pattern in _PATTERNS:
        if pattern.search(stderr):
            return kind
    return "other"


def failure(what: str, stderr: str, status: int | None) -> HostError:
    """The error for a bootc call that exited non-zero (or was killed: status None)."""
    message = error_lines(stderr) or f"{what} failed with exit status {status}"
    return HostError(message, kind=classify(stderr))


def timed_out(what: str, stderr: str, seconds: float) -> HostError:
    """The error for a bootc call that ran past its deadline: a lock wait when bootc said it
    was waiting for the sysroot lock (it never gives up by itself), else a plain timeout."""
    lock = re.search(r"waiting for sysroot lock", stderr, re.I) is not None
    kind = "lock" if lock else "timeout"
    detail = "waiting for the sysroot lock" if lock else "no result"
    return HostError(f"{what} timed out after {seconds:g}s ({detail})", kind=kind)
