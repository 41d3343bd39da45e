"""Errors that cross stage boundaries, each mapped to one HTTP status by the API."""

from __future__ import annotations


class KeyrankError(Exception):
    """Base class."""


class InvalidRequest(KeyrankError):
    """The caller sent something we cannot rank (-> 422). ``field`` names it."""

    def __init__(self, message: str, field: str | None = None):
        super().__init__(message)
        self.field = field


class ScoringUnavailable(KeyrankError):
    """Triton is down, not ready, or past the request deadline (-> 503 + Retry-After)."""


class ModelAssetsMissing(KeyrankError):
    """`keyrank prepare` has not been run for the configured model directory."""
