"""The runtime's one error for bad input (a blank text, an index past the text's end, a pair for a single-text
model): a ValueError whose message says what to change. The web layer answers it with 422 (app/errors.py)."""


class InputError(ValueError):
    """The input cannot be run as given; the message says what to change."""


class Stopped(Exception):
    """A run stopped between its pieces because nobody waits for its result any more (its client went away or
    cancelled it): it has no result, and nothing is kept of it."""


class OutOfMemory(Exception):
    """A run needed more memory than its device has free, or than the server lets onnxruntime's runs hold
    (ATTNSCOPE_ARENA_MB): that run fails, the next one runs. The message says what to change; the web layer answers
    507 (app/errors.py)."""
