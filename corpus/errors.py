"""The corpus job's one error: it cannot run as asked (a missing column, an unreadable file, no texts, a worker that
could not start); the message says why and what to do."""


class CorpusError(ValueError):
    """The job cannot run as asked (missing column, unreadable file, no texts, ...); the message says why."""


class Cancelled(Exception):
    """A job stopped between chunks because its caller asked (run_corpus's `stop`); its partial sums are kept."""
