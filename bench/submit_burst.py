"""The ``purge_submit`` fault of the chaos harness: ``RATCHET_SUBMIT`` purged while
submissions are queued in it.

What a purge can take, and what it must not (docs/operations.md, "What Ratchet
survives"): a submit is *acknowledged* by Ratchet once its task is committed — the node
answered OK (``ratchet.api.<tenant>.submit``, ``ratchet submit``), or the task is in
the store (``status``, ``task.queued``). A JetStream publish ack (what ``Client.submit`` and
``ratchet submit`` wait for) only says the stream holds the message: it survives node
crashes and restarts (intake acks a message after its task committed), not a purge of the
stream. So the fault checks, for the submits it publishes on JetStream:

- every one of them is in the store, or was removed by the purges: ``burst_lost`` (in the
  stream when purged, never accepted) is at most ``purged_messages`` (what the server says
  each purge removed), else ``burst_unexplained`` counts the difference;
- every one in the store settles, with each claim effective once (the probes' audit);

and the probes over the API (answered OK: acknowledged) are audited as for every fault.

So that the purges find submits still queued, each run publishes on a tenant of its own
(``burst-<run>``): the intake starts a tenant's consumer when it sees the tenant's first
submission go by, and creating and binding that consumer takes a few JetStream round
trips, so the first burst is mostly still in the stream when its purge (sent as soon as
its publishes are acked) comes; the later ones meet the running consumer and are accepted
or purged depending on the race.
"""

from __future__ import annotations

import asyncio
import json
import random
from typing import Any

from nats.aio.client import Client as NATS

import ratchet
from ratchet.protocol.ids import task_id_for
from ratchet.protocol.subjects import STREAM_SUBMIT

#: Submits per burst, bursts per run.
BURST, BURSTS = 5, 10


async def purge_stream(nc: NATS, stream: str) -> int:
    """Purge the whole stream; how many messages the server says it removed (nats-py's
    ``purge_stream`` returns only whether it succeeded)."""
    msg = await nc.request(f"$JS.API.STREAM.PURGE.{stream}", b"", timeout=5.0)
    reply = json.loads(msg.data)
    if not reply.get("success"):
        raise RuntimeError(f"purge of {stream} failed: {reply}")
    return int(reply.get("purged", 0))


class SubmitBurst:
    """Bursts of JetStream submits on a tenant of the run's own, with purges between."""

    def __init__(self, client: ratchet.Client, run: int) -> None:
        self.producer = ratchet.Client(client.nc, f"burst-{run}")
        self.run = run
        self.published: dict[str, str] = {}  # task id -> report id, publish acked
        self.purged: list[int] = []  # what each purge removed

    async def strike(self) -> None:
        """Bursts (each published at once, every submit waiting for its publish ack), each
        purged 0 to 0.3 s later: about two seconds. From its first burst on, the intake
        takes the tenant's submits as they come."""
        rng = random.Random(self.run)
        for burst in range(BURSTS):
            reports = [f"burst-{self.run}-{burst}-{i}" for i in range(BURST)]
            await asyncio.gather(*(self._publish(r) for r in reports))
            # The intake's chance — next to none for the first burst, purged as soon as its
            # publishes are acked, while the intake is still creating the tenant's consumer.
            await asyncio.sleep(rng.uniform(0.0, 0.3) if burst else 0.0)
            self.purged.append(await self._purge())

    async def _publish(self, report: str) -> None:
        task_id = (await self.producer.submit("expense.split", {
            "report_id": report, "employee": "e-3", "travel": 3, "hotel": 4,
            "fail_after_writes": False}, key=report)).task_id
        self.published[task_id] = report
        assert task_id == task_id_for(self.producer.tenant, report)

    async def _purge(self) -> int:
        return await purge_stream(self.producer.nc, STREAM_SUBMIT)

    def accounting(self, in_store: set[str]) -> dict[str, Any]:
        """What became of the published submits, given those whose task is in the store."""
        lost = sum(t not in in_store for t in self.published)
        purged = sum(self.purged)
        return {"purged_messages": purged, "purged_by_purge": self.purged,
                "burst_published": len(self.published),
                "burst_accepted": len(self.published) - lost, "burst_lost": lost,
                "burst_unexplained": max(0, lost - purged)}
