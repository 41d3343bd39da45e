"""Errors that cross stage boundaries, each mapped to one HTTP status by the API (api/errors.py)."""

from __future__ import annotations


class KeyrankError(Exception):
    """Base class."""


class InvalidRequest(KeyrankError):
    """The caller sent something we cannot rank (-> 422). ``field`` names it."""

    def __init__(self, message: str, field: str | None = None):
        super().__init__(message)
        self.field = field


class LimitExceeded(InvalidRequest):
    """A configured request limit was exceeded (-> 422); ``setting`` names the environment variable."""

    def __init__(self, field: str, what: str, limit: int, setting: str):
        super().__init__(f"{field}: {what} exceed the limit of {limit} ({setting})", field=field)
        self.setting = setting


class TooCostly(InvalidRequest):
    """The request alone cannot finish inside its deadline at the measured rate (-> 422 at the door, never a
    503 after the deadline): the message says what to change."""


class Overloaded(KeyrankError):
    """Admitting the request would pass the bound on queued work (-> 429 + Retry-After)."""

    def __init__(self, message: str, retry_after_s: int):
        super().__init__(message)
        self.retry_after_s = retry_after_s


class ClientClosed(KeyrankError):
    """The client disconnected before its answer was ready; its work was cancelled (-> 499, logged only)."""


class ScoringUnavailable(KeyrankError):
    """Triton is down, not ready, or past the request deadline (-> 503 + Retry-After)."""


class ModelAssetsMissing(KeyrankError):
    """`keyrank prepare` has not been run for the configured model directory."""
