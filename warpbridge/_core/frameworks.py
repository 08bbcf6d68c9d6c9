"""The core's way to the framework backends, which sit above it: a slot that
``_backends.registry`` fills with itself when it is imported (``import warpbridge`` imports
it first), so that no module of the core imports upward."""

from __future__ import annotations

from typing import Any

registry: Any = None  # the _backends.registry module


def fill(module: Any) -> None:
    """Called once, by the registry as it is imported."""
    global registry
    registry = module
