"""Per-tenant submit rate limits at intake: a token bucket per tenant.

A tenant may submit ``rate`` tasks a second on average and ``burst`` at once; a submission
over that is refused with RATE_LIMITED (retryable, ``retry_after``: when the bucket will
hold a token again) by the JetStream intake and the API's ``submit`` alike, instead of
being queued without bound. Every submission counts, a repeat of a key too (telling a
repeat apart would cost a store read before the limit, which is what the limit protects).

The limit is per node: with N nodes a tenant may submit up to N times the rate in all
(each node takes its share of the submit stream). Time is the injected clock's
``monotonic`` (tests skip it). How it composes with admission (quotas, weights,
priorities): docs/operations.md, "Fair admission".
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from ratchet.protocol.errors import RateLimited

__all__ = ["SubmitLimits"]


@dataclass
class _Bucket:
    tokens: float
    at: float


@dataclass
class SubmitLimits:
    """Token buckets per tenant.

    Args:
        rate: submissions a second a tenant may make (None: unlimited, unless ``rates``
            names it).
        rates: per-tenant rates, overriding ``rate``.
        burst: how many a tenant may make at once (None: one second's worth, at least 1).
        now: the monotonic clock (the node's ``clock.monotonic``).

    Raises:
        ValueError: a rate or burst that is not > 0.
    """

    rate: float | None
    rates: Mapping[str, float] = field(default_factory=dict)
    burst: int | None = None
    now: Callable[[], float] = lambda: 0.0
    _buckets: dict[str, _Bucket] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for tenant, rate in {"*": self.rate, **self.rates}.items():
            if rate is not None and not rate > 0:
                raise ValueError(f"submit rate of {tenant!r} must be > 0, got {rate}")
        if self.burst is not None and self.burst < 1:
            raise ValueError(f"submit burst must be >= 1, got {self.burst}")

    def rate_of(self, tenant: str) -> float | None:
        return self.rates.get(tenant, self.rate)

    def take(self, tenant: str) -> None:
        """Take one token of ``tenant``'s bucket.

        Raises:
            RateLimited: none left; ``retry_after`` says when one will be.
        """
        rate = self.rate_of(tenant)
        if rate is None:
            return
        capacity = float(self.burst if self.burst is not None else max(1, round(rate)))
        now = self.now()
        bucket = self._buckets.get(tenant)
        if bucket is None:
            bucket = self._buckets[tenant] = _Bucket(capacity, now)
        bucket.tokens = min(capacity, bucket.tokens + (now - bucket.at) * rate)
        bucket.at = now
        if bucket.tokens >= 1.0:
            bucket.tokens -= 1.0
            return
        raise RateLimited(f"tenant {tenant} submits faster than {rate:g}/s; retry later",
                          retry_after=(1.0 - bucket.tokens) / rate, tenant=tenant,
                          rate=rate, burst=int(capacity))
