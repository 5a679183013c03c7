"""The harness's expected failures, each turned by the CLI into one line on stderr.

Usage errors (bad arguments or input files, found before anything runs) are
`variants.problem.IPAInputError`, exit status 2. A `RunFailure` happens while running (a full
disk under a sweep): exit status 1, with what is on disk and how to resume in the message.
"""


class RunFailure(RuntimeError):
    """A run stopped by its environment, not by a bug; the message says what to do."""
