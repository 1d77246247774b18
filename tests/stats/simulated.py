"""Studies simulated where the truth is known (the full tables: docs/studies.md). The noise between
runs is airbench94's 0.15 points, a share CORRELATION of it common to every cell of a run: study.py
gives run i of every configuration and epoch count the same seeds."""
import math

import numpy as np

from studylib.stats import fits

NOISE = 0.0015
CORRELATION = 0.5
LAW_A = fits.PowerLaw(a=-0.75, b=0.45, c=0.03)  # error against epochs, measured on GRID
GRID = (5, 10, 20, 40)
SPEEDUP = 0.25  # of a compared configuration: its accuracy at E epochs is law A's at 1.25 E


def noisy(rng, means, runs, correlation=CORRELATION):
    """runs x cells of accuracies about the cells' means; the run effect, one draw per run shared
    by its cells, is what pairing by seed cancels."""
    means = np.atleast_1d(np.asarray(means, dtype=float))
    return (means + rng.normal(0, NOISE * math.sqrt(correlation), (runs, 1))
            + rng.normal(0, NOISE * math.sqrt(1 - correlation), (runs, means.size)))


def law_a_study(rng, runs, draws, target=None, epochs=None):
    """One study of law A: (study's interval, the former one) of the epochs to `target`, or else
    of the speedup at `epochs`. The former drew each cell's mean alone from its own Student t, as
    if the cells did not share seeds; its quantiles are taken as fits takes them."""
    truths = 1 - LAW_A.error_at(GRID if target else (*GRID, (1 + SPEEDUP) * epochs))
    cells = list(noisy(rng, truths, runs).T)
    seed = int(rng.integers(1 << 31))
    if target:
        ours = fits.epochs_to_accuracy_interval(dict(zip(GRID, cells)), target, draws=draws,
                                                seed=seed, paired=True)
    else:
        ours = fits.effective_speedup_interval(dict(zip(GRID, cells[:-1])), cells[-1], epochs,
                                               draws=draws, seed=seed, paired=True)
    means = np.stack([cell.mean() + cell.std(ddof=1) / math.sqrt(cell.size)
                      * rng.standard_t(cell.size - 1, draws) for cell in cells], axis=1)
    a, b, c, _ = fits.fit_power_laws(GRID, 1 - means[:, :len(GRID)])
    values = fits._epochs_for_errors(a, b, c, 1 - target if target else 1 - means[:, -1])
    kept = np.sort(values if target else values / epochs - 1)
    kept = kept[~np.isnan(kept)]
    low = kept[min(int(math.floor(0.025 * kept.size)), kept.size - 1)]
    high = kept[min(int(math.ceil(0.975 * kept.size)) - 1, kept.size - 1)]
    return ours, dict(ci_low=float(low) if math.isfinite(low) else None,
                      ci_high=float(high) if math.isfinite(high) else None)


def coverage(study, truth, studies, seed):
    """[ours, width, former, former_width] over `studies` studies (study(rng) -> (interval, former
    or None)): the share holding the truth (an open end: unbounded; no end: a miss), mean width."""
    rng = np.random.default_rng(seed)
    found = []
    for entries in zip(*[study(rng) for _ in range(studies)]):
        ends = [(entry['ci_low'], entry['ci_high']) for entry in entries if entry is not None]
        held = [(low, high) != (None, None) and (low is None or low <= truth)
                and (high is None or truth <= high) for low, high in ends]
        widths = [high - low for low, high in ends if None not in (low, high)]
        found += [np.mean(held) if held else None, np.mean(widths) if widths else None]
    return found


def simulated_halves(runs, temperature, rng, examples=10000, classes=10):
    """(halves, labels) of a simulated ensemble: each run predicts example i's class from its
    probabilities pi_i (Dirichlet, 0.15) independently, so a half's votes are one multinomial draw
    per example. Labels from pi^temperature, normalized: 1 is calibrated in the limit of many runs,
    0.6 an over-confident ensemble."""
    probabilities = rng.dirichlet(np.full(classes, 0.15), examples)
    tempered = probabilities ** temperature
    tempered /= tempered.sum(axis=1, keepdims=True)
    labels = np.minimum((rng.random((examples, 1)) > tempered.cumsum(axis=1)).sum(axis=1),
                        classes - 1)
    halves = [(rng.multinomial((runs + 1 - h) // 2, probabilities), (runs + 1 - h) // 2)
              for h in (0, 1)]
    return halves, labels
