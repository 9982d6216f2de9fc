"""What a long-running process of ours needs that is not pure and not the API: its command line
(:mod:`.usage`: usage errors, argument types, flags from the environment), JSON logs, pure
functions run in a short-lived child (:mod:`.isolated`, so pydantic never stays in an agent),
imports made without OpenSSL, reload by content digest with the last good value kept, supervised
loops and their backoff, and the ``result`` values of our counters. Below every process; it imports
only :mod:`ix_gpu.config` from ix_gpu.
"""
