"""The signing scheme of docs/protocol.md ("Signing a request"): the worked example's
figures are what the code computes, and the checks refuse what they must."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import nkeys
import pytest

from ratchet.protocol.auth import (
    SIG_HEADER,
    TIME_HEADER,
    ReplayGuard,
    Signer,
    new_seed,
    verify_signature,
)
from ratchet.protocol.codec import encode
from ratchet.protocol.errors import Unauthenticated
from ratchet.protocol.messages import Envelope

DOC = (Path(__file__).resolve().parent.parent / "docs" / "protocol.md").read_text()
SECTION = DOC.split("## Signing a request", 1)[1].split("\n## ", 1)[0]


def _row(label: str) -> str:
    match = re.search(rf"^\| {re.escape(label)} \| `([^`]+)` \|", SECTION, re.MULTILINE)
    assert match, label
    return match.group(1)


def test_the_worked_example_is_what_the_code_computes() -> None:
    seed = bytes(nkeys.encode_seed(bytes(range(32)), nkeys.PREFIX_BYTE_USER))
    assert _row("seed") == seed.decode()
    signer = Signer(seed)
    assert _row("public key") == signer.public_key
    env = Envelope(type="admin.get", message_id="cmd-7", correlation_id="cmd-7",
                   body={"command_id": "cmd-7", "task_id": "tsk_qechokxtkqbgkva7jy64grnk"})
    payload = encode(env)
    hex_block = SECTION.split("The payload in hex:\n\n```\n", 1)[1].split("```", 1)[0]
    assert bytes.fromhex(hex_block.replace("\n", "")) == payload
    assert _row("sha256(payload)") == hashlib.sha256(payload).hexdigest()
    issued = int(_row("`Ratchet-Time`"))
    headers = signer.headers(_row("subject"), payload, issued / 1000)
    assert headers[SIG_HEADER] == _row("`Ratchet-Sig`")
    assert verify_signature(signer.public_key, _row("subject"), payload, headers,
                            issued / 1000 + 299) == issued


def test_a_signature_binds_the_subject_the_payload_and_the_time() -> None:
    signer = Signer(new_seed())
    headers = signer.headers("ratchet.admin.acme.cancel", b"payload", 1000.0)
    with pytest.raises(Unauthenticated):  # another tenant's subject
        verify_signature(signer.public_key, "ratchet.admin.globex.cancel", b"payload",
                         headers, 1000.0)
    with pytest.raises(Unauthenticated):  # another payload
        verify_signature(signer.public_key, "ratchet.admin.acme.cancel", b"payloaf",
                         headers, 1000.0)
    with pytest.raises(Unauthenticated):  # too old
        verify_signature(signer.public_key, "ratchet.admin.acme.cancel", b"payload",
                         headers, 1000.0 + 301)
    with pytest.raises(Unauthenticated):  # another key
        verify_signature(Signer(new_seed()).public_key, "ratchet.admin.acme.cancel",
                         b"payload", headers, 1000.0)
    with pytest.raises(Unauthenticated):  # a forged time
        verify_signature(signer.public_key, "ratchet.admin.acme.cancel", b"payload",
                         {**headers, TIME_HEADER: "1001000"}, 1001.0)


def test_a_replayed_signature_is_refused_and_the_guard_stays_bounded() -> None:
    guard = ReplayGuard(capacity=3)
    guard.check("sig-1", 10.0)
    with pytest.raises(Unauthenticated):
        guard.check("sig-1", 11.0)
    for n in range(2, 10):
        guard.check(f"sig-{n}", 12.0)
    assert len(guard._seen) <= 3
