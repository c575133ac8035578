"""What every form module shares: `FormError`, and the helpers naming a record and reading list
columns.
"""

from __future__ import annotations

from typing import Any


class FormError(ValueError):
    """A row in a published form lacks what its form needs, or swerl cannot grade it as its set does."""


def _where(record: Any, index: int, origin: str) -> str:
    iid = record.get("instance_id") if isinstance(record, dict) else None
    return f"{origin} record {index}" + (f" ({iid})" if isinstance(iid, str) and iid else "")


def _plain(value: Any) -> Any:
    """parquet / datasets hand back numpy arrays for list columns."""
    return value.tolist() if hasattr(value, "tolist") else value
