"""Small helpers shared by the rule modules (not a rule; not in the registry)."""

from __future__ import annotations


def num(value: float | None, digits: int = 1) -> float | None:
    """Round evidence for humans and JSON; ``None`` stays ``None`` (not known is not zero)."""
    if value is None:
        return None
    return round(float(value), digits)


def show(value: float | None, digits: int = 1) -> str:
    """``87`` / ``86.5`` / ``?`` — compact numbers for summaries."""
    if value is None:
        return "?"
    text = f"{float(value):.{digits}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


THERMAL = "thermal"  # the incident family of Rules 1 and 8's tiers (core/remedy.Incident), which Rule 4.3 joins
