"""The refusals of planning and running an analysis: each says what to change. They know nothing of HTTP: app/errors.py
maps each to its status code once (STATUS), and the in-process API to the same ApiError a remote call raises."""
from __future__ import annotations


class ServiceError(Exception):
    """A request the service will not serve as asked; the message says what to change."""

    def __init__(self, detail: str, headers: dict[str, str] | None = None):
        super().__init__(detail)
        self.detail, self.headers = detail, headers


class UnknownModel(ServiceError):
    """No served model has that id."""


class TooLarge(ServiceError):
    """The text is over its limit."""


class Refused(ServiceError):
    """An option this model or this text cannot take (an index out of range, an answer too large for its form)."""


class Busy(ServiceError):
    """Too many model runs are waiting; retry after a moment."""


class Loading(ServiceError):
    """The model is still loading (the server answers while its models load, app/service.py); retry after a moment."""


LOADING_RETRY_S = 2   # the Retry-After of a request for a model still loading


class UnknownJob(ServiceError):
    """No job has that id."""


class Conflict(ServiceError):
    """The job is not in a state that allows this (cancelling a finished job, the result of a running one)."""


class QueueFull(ServiceError):
    """Too many jobs are waiting to run."""


class BadBody(ServiceError):
    """A request body that cannot be read at all (not UTF-8)."""


class DiskFull(ServiceError):
    """The jobs folder would pass its disk budget (ATTNSCOPE_MAX_JOBS_DISK_MB)."""


class Invalid(ServiceError):
    """A body that fails its schema's checks (pydantic's errors, each with its `loc`), or is not JSON at all
    (`not_json`): the same answer the framework gives a route's body (app/errors.py)."""

    def __init__(self, errors: list[dict], not_json: bool = False):
        super().__init__("the request body is not valid JSON" if not_json else
                         "; ".join(str(e.get("msg", "invalid")) for e in errors[:5]))
        self.errors, self.not_json = errors, not_json
