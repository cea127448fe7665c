"""Errors raised by the data layer; each message says what is wrong and how to fix it."""


class DataError(ValueError):
    """A data set is missing, corrupt, or of the wrong shape."""
