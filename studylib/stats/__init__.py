"""The statistics of a study, on plain arrays of per-run numbers: nothing here imports the engine,
so the functions serve any table of runs (study.load_study's, or your own).

inference: comparisons (paired and Welch), target tests, equivalence tests (TOST), power and the
runs needed, Holm's adjustment, time ratios. fits: power laws of error against epochs, epochs to a
target and effective speedups, with their intervals. variance: the test-set and distribution-wise
standard deviations, calibration error, and the streaming tally of saved logits."""
