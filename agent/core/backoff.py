"""Retry delays for loops that wait between passes rather than retrying one call (pure)."""

from __future__ import annotations

from tenacity import RetryCallState, wait_exponential_jitter


def backoff(failures: int, initial: float, cap: float, jitter: float | None = None) -> float:
    """Seconds before the next try after `failures` failures in a row: `initial` doubling,
    plus up to `jitter` (default `initial`) at random so hosts refused together do not come
    back together, never more than `cap`. tenacity's exponential-with-jitter wait, scaled from
    a 1-second base (tenacity 9 deprecates its `initial`; 8.x has no `multiplier`)."""
    wait = wait_exponential_jitter(max=cap / initial, jitter=(initial if jitter is None
                                                              else jitter) / initial)  # fmt: skip
    state = RetryCallState(retry_object=None, fn=None, args=(), kwargs={})  # type: ignore[arg-type]
    state.attempt_number = max(1, failures)
    return initial * float(wait(state))
