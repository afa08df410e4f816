"""Fetch configuration: how a reader talks to a store reached over a network.

A frozen, keyword-only dataclass that validates on construction and does no I/O, like the write and
loader configurations of :mod:`dali_alchemi.config` (which re-exports it).
"""

from __future__ import annotations

from dataclasses import dataclass

from dali_alchemi.errors import ConfigError

__all__ = ["REDIRECT_POLICIES", "FetchConfig"]


REDIRECT_POLICIES = ("same-origin", "any")
"""What ``FetchConfig.follow_redirects`` may be: follow redirects within the store's origin (scheme, host
and port) only, or every redirect."""


@dataclass(frozen=True, slots=True, kw_only=True)
class FetchConfig:
    """How a reader talks to a non-local store (HTTP, S3, GCS, ...).

    Parameters
    ----------
    max_concurrency
        Chunk requests in flight at once (latency-bound, so well above the core count).
    retries
        Further attempts after a failed request before giving up with a ``RemoteReadError``.
    backoff_s
        Wait before the first retry; it doubles with every further retry, up to ``max_backoff_s``.
    timeout_s
        Longest wait for one request, connecting and reading together (10 s). A server that accepts
        a connection and never answers costs at most ``timeout_s * (retries + 1)`` plus the back-off
        per read, then a ``RemoteReadError``; without it, the HTTP stack waits 300 s per attempt.
    follow_redirects
        Which HTTP redirects a store opened from an ``http(s)://`` URL follows: ``"same-origin"`` (the
        default) those to the same scheme, host and port; ``"any"`` also those to another host. A
        redirect that is not followed fails the read with a ``RemoteRedirectError`` naming both URLs.
    """

    max_concurrency: int = 32
    retries: int = 4
    backoff_s: float = 0.05
    max_backoff_s: float = 2.0
    timeout_s: float = 10.0
    follow_redirects: str = "same-origin"

    def __post_init__(self) -> None:
        if self.max_concurrency < 1:
            raise ConfigError(f"max_concurrency must be >= 1, got {self.max_concurrency}")
        if self.retries < 0:
            raise ConfigError(f"retries must be >= 0, got {self.retries}")
        if self.backoff_s < 0 or self.max_backoff_s < self.backoff_s:
            raise ConfigError(f"need 0 <= backoff_s <= max_backoff_s, got {self.backoff_s} and {self.max_backoff_s}")
        if not self.timeout_s > 0 or self.timeout_s == float("inf"):
            raise ConfigError(f"timeout_s must be a positive, finite number of seconds, got {self.timeout_s}")
        if self.follow_redirects not in REDIRECT_POLICIES:
            raise ConfigError(f"follow_redirects must be one of {REDIRECT_POLICIES}, got {self.follow_redirects!r}")

    def worst_case_s(self) -> float:
        """The longest one read can take before it gives up: every attempt timing out, and the back-off between."""
        return self.timeout_s * (self.retries + 1) + sum(self.delay(a) for a in range(self.retries))

    def delay(self, attempt: int) -> float:
        """Seconds to wait before retry number ``attempt`` (0-based)."""
        return float(min(self.max_backoff_s, self.backoff_s * (2**attempt)))
