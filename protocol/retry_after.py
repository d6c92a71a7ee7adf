"""A provider's ``Retry-After`` header, read once for every HTTP tool and model adapter.

Here, the lowest layer, because both the runtime's OpenAI-compatible model adapter
(``actors/agents/openai_model.py``) and the finance simulator's client (``ratchet/testing``, which
imports only ``protocol`` and the facade) turn a 429 into ``ToolRateLimited(retry_after=...)``.
"""

from __future__ import annotations

import email.utils
import time
from typing import Any

__all__ = ["retry_after_seconds"]


def retry_after_seconds(headers: Any, default: float = 1.0) -> float:
    """Retry-After in seconds: delta-seconds or an HTTP date; ``default`` when absent/bad.

    Args:
        headers: anything with ``.get(name)`` (``http.client.HTTPMessage``, a dict), or None.
    """
    value = headers.get("Retry-After") if headers is not None else None
    if not value:
        return default
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return default
    # An HTTP date is wall-clock time: compared with the wall clock, not the task clock.
    return max(0.0, when.timestamp() - time.time())
