"""The admin service's dead-letter verbs — ``dlq-list`` and ``dlq-show`` (role viewer),
``dlq-replay`` and ``dlq-purge`` (role operator) — a mixin of
:class:`~supervisors.services.admin.AdminActor`.

On a tenant's subject they see and act on that tenant's dead letters only (the letters of
its DLQ subjects, ``ratchet.dlq.<source>.<tenant>``); on the ``_system`` subject on every
letter, among them the mail router's (``ratchet.dlq.mail._system``) and those whose subject
named no valid tenant. Like every verb they are role-checked, deduplicated by command id
and audited (with their arguments) by ``AdminActor.answer``.

A replay republishes the original message with its original headers to its original
subject through the outbox (persistence/dead_letter_rows.py: at most ``MAX_REPLAYS`` times
per chain, so a poison message goes back to the DLQ and stays there); only messages of
the JetStream work queues can be replayed — a request/reply API call's requester is gone.
"""

from __future__ import annotations

import base64
from typing import Any

from ratchet.actors.transport.bus import Bus
from ratchet.persistence.dead_letter_rows import MAX_REPLAYS
from ratchet.protocol.admin_verbs import SYSTEM_TENANT
from ratchet.protocol.codec import decode_map
from ratchet.protocol.errors import InvalidMessage, NotFound, RatchetError
from ratchet.protocol.messages import AdminCommand
from ratchet.protocol.redaction import redact
from ratchet.protocol.subjects import STREAM_DLQ, tenant_of
from ratchet.supervisors.services.admin_reads import ReadVerbs

__all__ = ["DlqVerbs", "REPLAYABLE"]

#: Subjects a dead letter can be replayed to: the work queues' (actors/transport/bus.py).
REPLAYABLE = ("ratchet.submit.", "ratchet.mail.", "ratchet.external.", "ratchet.decisions.")
_MAX_IDS = 100  # letters one replay or purge names at most
_SHOWN_RAW = 64 * 1024  # bytes of a raw message dlq-show returns
_MAX_ID = 2**62  # a letter id SQLite can hold


class DlqVerbs(ReadVerbs):
    """``dlq-list``, ``dlq-show``, ``dlq-replay``, ``dlq-purge``."""

    bus: Bus

    @staticmethod
    def _scope(tenant: str) -> str | None:
        return None if tenant == SYSTEM_TENANT else tenant

    @staticmethod
    def _ids(cmd: AdminCommand, *, required: bool) -> list[int] | None:
        ids = cmd.args.get("ids")
        if ids is None and not required:
            return None
        if (not isinstance(ids, list) or not 1 <= len(ids) <= _MAX_IDS
                or any(isinstance(i, bool) or not isinstance(i, int) or not 0 < i < _MAX_ID
                       for i in ids)):
            raise InvalidMessage(f"args.ids must be a list of 1 to {_MAX_IDS} letter ids",
                                 field="ids")
        return list(dict.fromkeys(ids))

    async def _dlq_list(self, tenant: str, cmd: AdminCommand) -> dict[str, Any]:
        """Per DLQ subject the count, bytes, oldest and newest; then a page of letters
        (oldest first, optionally of one ``subject``) with their reason and headers."""
        scope = self._scope(tenant)
        subject = self._str_arg(cmd, "subject", max_length=256)
        after = self._int_arg(cmd, "after", 0, high=_MAX_ID)
        limit = self._int_arg(cmd, "limit", 100, low=1, high=500)
        letters = await self.store.dead_letter_page(scope, subject, after, limit)
        return {"subjects": await self.store.dead_letter_subjects(scope), "letters": letters,
                "next_after": letters[-1]["id"] if len(letters) == limit else None}

    async def _dlq_show(self, tenant: str, cmd: AdminCommand) -> dict[str, Any]:
        """One letter: its reason, details, original subject and headers, and its message
        (decoded when it is a msgpack map, secrets redacted; and the first 64 KiB raw)."""
        letter_id = self._int_arg(cmd, "id", 0, low=1, high=_MAX_ID)
        letter = await self.store.dead_letter(self._scope(tenant), letter_id)
        if letter is None:
            raise NotFound("no such dead letter", id=letter_id)
        raw: bytes = letter.pop("raw")
        try:
            decoded: Any = redact(decode_map(raw))
        except (RatchetError, ValueError, TypeError):
            decoded = None
        return {**letter, "decoded": decoded, "raw_b64": base64.b64encode(
            raw[:_SHOWN_RAW]).decode(), "raw_truncated": len(raw) > _SHOWN_RAW,
            "max_replays": MAX_REPLAYS}

    async def _dlq_replay(self, tenant: str, cmd: AdminCommand) -> dict[str, Any]:
        """Republish letters' messages to their original subjects (``ids``, at most 100)."""
        scope, ids = self._scope(tenant), self._ids(cmd, required=True)
        assert ids is not None
        refused: list[dict[str, Any]] = []
        allowed: list[int] = []
        for letter_id in ids:
            letter = await self.store.dead_letter(scope, letter_id)
            why = self._not_replayable(tenant, letter)
            if why:
                refused.append({"id": letter_id, "outcome": why})
            else:
                allowed.append(letter_id)
        done = await self.store.replay_dead_letters(scope, allowed, self.clock.now())
        return {"results": sorted(done + refused, key=lambda r: ids.index(r["id"]))}

    @staticmethod
    def _not_replayable(tenant: str, letter: dict[str, Any] | None) -> str | None:
        if letter is None:
            return "not found"
        subject = letter["subject"]
        if not subject.startswith(REPLAYABLE):
            return f"refused: {subject} is not a JetStream subject (nobody awaits a reply)"
        if tenant != SYSTEM_TENANT and (subject.startswith("ratchet.mail.")
                                        or tenant_of(subject) != tenant):
            return "refused: only a _system operator replays this letter"
        return None

    async def _dlq_purge(self, tenant: str, cmd: AdminCommand) -> dict[str, Any]:
        """Delete letters: ``ids``, or every letter of a DLQ ``subject``, or those received
        ``before`` a time, or ``all`` (of the tenant; on _system of everyone). Purging a
        subject or all purges the ``RATCHET_DLQ`` stream's messages of it too."""
        scope, ids = self._scope(tenant), self._ids(cmd, required=False)
        subject = self._str_arg(cmd, "subject", max_length=256)
        before = cmd.args.get("before")
        if before is not None and (isinstance(before, bool)
                                   or not isinstance(before, int | float)):
            raise InvalidMessage("args.before must be a time (seconds since the epoch)",
                                 field="before")
        everything = cmd.args.get("all") is True
        if ids is None and subject is None and before is None and not everything:
            raise InvalidMessage("dlq-purge needs ids, subject, before or all")
        removed = await self.store.purge_dead_letters(
            scope, ids, subject, None if before is None else float(before))
        stream: str | None = None  # what of the RATCHET_DLQ stream goes too
        if ids is None and before is None:  # a whole subject, or everything in scope
            if scope is None:
                stream = subject or "ratchet.dlq.>"
            elif subject is None:
                stream = f"ratchet.dlq.*.{scope}"
            elif subject.startswith("ratchet.dlq.") and subject.endswith(f".{scope}"):
                stream = subject
        if stream is not None:
            await self.bus.js.purge_stream(STREAM_DLQ, subject=stream)
        return {"removed": removed, "stream_purged": stream}
