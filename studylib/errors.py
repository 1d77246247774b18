"""The ways a study stops early, each with the exit status that tells a scheduler what to do
(docs/studies.md, "Exit statuses"): retry the same command, or look first."""


class StudyError(Exception):
    """Bad input or a study directory in the way; the message says what to do. Nothing was trained
    (or, for an analysis the report command requires, nothing more can be said)."""
    exit_status = 1


class RunsFailed(StudyError):
    """Runs that failed or were lost (their tries are recorded): the same command retries them."""
    exit_status = 2


class ReportFailed(StudyError):
    """The runs are written but the summary, report or plots could not be."""
    exit_status = 3


class StorageError(StudyError):
    """A file of the study directory could not be written (a full disk, permissions)."""
    exit_status = 4


class Stopped(BaseException):
    """SIGTERM: a scheduler's preemption, or torchrun stopping the others when one process fails.
    Like KeyboardInterrupt, not an Exception: a run it interrupts has not failed."""
