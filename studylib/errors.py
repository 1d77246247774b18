"""The two ways a study stops early: bad input, and a signal to stop."""


class StudyError(Exception):
    """Bad input or a study directory in the way; the message says what to do."""


class Stopped(BaseException):
    """SIGTERM: a scheduler's preemption, or torchrun stopping the others when one process fails.
    Like KeyboardInterrupt, not an Exception: a run it interrupts has not failed."""
