"""The run slots of a runtime: at most ``total`` runs active, the others wait in order.

What ``anyio.CapacityLimiter`` does for runs, without its two checkpoints and shielded
cancel scope per acquisition (a run that finds a free slot takes it without a trip through
the event loop) and with a future made only for a run that has to wait. A freed slot goes
straight to the first waiter, so a burst of new runs cannot overtake the queue.
"""

from __future__ import annotations

from collections import deque

from bus import aio_seam

__all__ = ["RunSlots"]


class RunSlots:
    """Counts the runs holding a slot; :meth:`acquire` waits for one, FIFO."""

    __slots__ = ("_waiters", "borrowed", "total")

    def __init__(self, total: int) -> None:
        self.total = total
        self.borrowed = 0
        self._waiters: deque[aio_seam.Future[None]] = deque()

    async def acquire(self) -> None:
        """Take a slot, waiting for one if all are held. Cancelled while waiting, the
        caller holds none (a slot handed over meanwhile is passed on)."""
        if self.borrowed < self.total and not self._waiters:
            self.borrowed += 1
            return
        waiter: aio_seam.Future[None] = aio_seam.Future()
        self._waiters.append(waiter)
        try:
            await waiter
        except BaseException:
            if waiter.done() and not waiter.cancelled():
                self.release()  # the slot came as we were cancelled: the next run's
            else:
                self._waiters.remove(waiter)
            raise

    def release(self) -> None:
        """Give a slot back: to the first run still waiting, else to the pool."""
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)  # the slot changes hands: borrowed stays
                return
        self.borrowed -= 1
