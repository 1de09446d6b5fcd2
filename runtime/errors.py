"""The runtime's one error for bad input (a blank text, an index past the text's end, a pair for a single-text
model): a ValueError whose message says what to change. The web layer answers it with 422 (app/errors.py)."""


class InputError(ValueError):
    """The input cannot be run as given; the message says what to change."""
