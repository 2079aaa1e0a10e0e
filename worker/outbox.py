"""Finished trajectories on their way to the trainer: kept until the trainer has them.

A delivery leaves the outbox only after the trainer acknowledged it, or answered that it
never will (`Rejected`: stale, invalid); any other failure keeps it
(and everything behind it, so order holds) and retries after a backoff that doubles up to
a ceiling. Nothing is dropped: when the outbox holds `capacity` deliveries the worker
refuses new placements instead (`full`), so a long trainer outage backs work up into the
pending pool rather than into memory or the void. The trainer deduplicates by
`Delivery.key`, which covers an acknowledgement lost on the way back.
"""

from __future__ import annotations

import collections
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from cadence.worker.api import Delivery
from cadence.worker.engine import Clock

log = logging.getLogger("cadence.worker")

Send = Callable[[Delivery], Awaitable[None]]


class Rejected(Exception):
    """The trainer answered that it will never take this delivery (not the current
    attempt, not trainable): the outbox drops it, counted, instead of retrying it for
    ever in front of everything behind it. No worker holds the sample any more, so the
    control loop re-queues it if the ledger still expects it."""


@dataclass
class Outbox:
    send: Send
    clock: Clock
    capacity: int = 1024
    backoff_s: float = 0.5
    # Short: a worker retries a recovered trainer within seconds (one request a try).
    max_backoff_s: float = 5.0
    queue: collections.deque[Delivery] = field(default_factory=collections.deque)
    delivered: int = 0
    failures: int = 0
    rejected: int = 0
    _retry_at: float = 0.0
    _backoff: float = 0.0

    @property
    def full(self) -> bool:
        return len(self.queue) >= self.capacity

    def put(self, delivery: Delivery) -> None:
        """Always accepted: a finished trajectory is never dropped (see `full`)."""
        self.queue.append(delivery)

    async def flush(self) -> int:
        """Send what is queued, in order, until one fails; returns how many went."""
        if not self.queue or self.clock.now() < self._retry_at:
            return 0
        sent = 0
        while self.queue:
            try:
                await self.send(self.queue[0])
            except Rejected as e:
                log.warning("the trainer refused %s for good: %s", self.queue[0].key, e)
                self.queue.popleft()
                self.rejected += 1
                continue
            except Exception:
                self.failures += 1
                self._backoff = min(self.max_backoff_s, max(self.backoff_s, 2 * self._backoff))
                self._retry_at = self.clock.now() + self._backoff
                break
            self.queue.popleft()
            self.delivered += 1
            sent += 1
            self._backoff = 0.0
        return sent
