"""The one clock trajlake stamps rows with: timezone-aware UTC."""

from __future__ import annotations

from datetime import datetime, timezone


def utc_now() -> datetime:
    return datetime.now(timezone.utc)


__all__ = ["utc_now"]
