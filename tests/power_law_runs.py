"""Runs about a known power law of error against epochs, for the fits' tests (tests/stats) and the
report's (tests/engine); and a real curve whose errors fall faster and faster."""
import numpy as np

from studylib.stats.fits import PowerLaw

EPOCHS = [10, 20, 40, 80]
LAW = PowerLaw(a=-1.3, b=0.5, c=0.05)

# airbench94 with random and alternating flip at 0.5, 1 and 2 epochs on a CPU (docs/results.md,
# "A demonstration"): TTA accuracies of runs 0 and 1. Its errors fall faster and faster.
SHORT_RANDOM = {0.5: [0.5475, 0.5418], 1: [0.6751, 0.6798], 2: [0.8147, 0.8099]}
SHORT_ALTERNATING = {0.5: [0.5433, 0.5376], 1: [0.6848, 0.6791], 2: [0.8106, 0.8102]}


def synthetic_runs(runs, noise, seed, law=LAW, epochs=EPOCHS):
    """{epochs: per-run accuracies}: the law's accuracy 1 - error plus Gaussian noise between runs
    (noise 0.0015 is about airbench94's 0.15% standard deviation)."""
    rng = np.random.default_rng(seed)
    return {e: 1 - float(law.error_at(e)) + rng.normal(0, noise, runs) for e in epochs}
