"""Errors of the tracking package (shared by the client and the server, which import nothing else of each other's)."""


class TrackingError(ValueError):
    """A bad `tracking` setting (named field, allowed values)."""


class TrackingUnavailable(RuntimeError):
    """The store could not be written after all retries (down, locked, or refusing)."""


__all__ = ["TrackingError", "TrackingUnavailable"]
