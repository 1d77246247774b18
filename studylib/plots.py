"""A study's plots, from its runs and summary.json's numbers: accuracy.png and time.png (each
configuration's runs, one row per configuration so that long grid names stay legible) and, with an
epoch grid, epochs.png (error against epochs with each point's interval and the fitted laws)."""
import math

import matplotlib
import numpy as np

from .files import StudyDir

ROW_INCHES = 0.32  # height of one configuration's row
COLOURS = 10  # matplotlib's default colour cycle; past it, curves change marker
MARKERS = 'osD^v'


def plot(study_dir, summary, runs):
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    names = list(summary['configs'])
    plot_accuracy(study_dir, summary, runs, names, plt)
    plot_time(study_dir, runs, names, plt)
    speedup = summary['speedup']
    if isinstance(speedup, dict) and 'curves' in speedup:
        plot_epochs(study_dir, speedup, plt)


def rows_figure(plt, names, xlabel, title):
    height = 1.6 + ROW_INCHES * len(names)
    width = 6.5 + 0.055 * max(map(len, names), default=0)
    figure, axes = plt.subplots(figsize=(width, height))
    axes.set_yticks(range(len(names)), names, fontsize=8)
    axes.set_ylim(len(names) - 0.5, -0.5)
    axes.set_xlabel(xlabel)
    axes.set_title(title, fontsize=10)
    axes.grid(axis='x', alpha=0.3)
    return figure, axes


def jitter(count, row, rng):
    return row + rng.uniform(-0.18, 0.18, count)


def plot_accuracy(study_dir, summary, runs, names, plt):
    rng = np.random.default_rng(0)
    figure, axes = rows_figure(plt, names, f"{summary['accuracy_on']} accuracy",
                               'accuracy of each run, and the mean with its 95% CI')
    for row, name in enumerate(names):
        mine = runs[runs['config'] == name] if len(runs) else runs
        if len(mine):
            diverged = mine['diverged'].fillna(False).astype(bool) if 'diverged' in mine \
                else np.zeros(len(mine), dtype=bool)
            kept = mine[~diverged]
            lost = mine[diverged]
            axes.scatter(kept['accuracy'], jitter(len(kept), row, rng), s=12, alpha=0.5,
                         color='tab:blue', label='a run')
            if len(lost):  # counted by the record claims; drawn, they would crush the scale
                axes.annotate(f'+{len(lost)} diverged', (1.0, row), xytext=(4, 0),
                              xycoords=('axes fraction', 'data'), textcoords='offset points',
                              va='center', fontsize=7, color='tab:red', annotation_clip=False)
        config = summary['configs'][name]
        if config.get('ci_low') is not None:  # an accuracy's interval stays within [0, 1]
            low = max(config['ci_low'], 0.0)
            high = min(config['ci_high'], 1.0)
            axes.errorbar([config['mean']], [row], color='black', capsize=4, fmt='o',
                          xerr=[[config['mean'] - low], [high - config['mean']]],
                          label='mean, 95% CI')
        elif config.get('mean') is not None:  # one run, or runs that all scored the same
            axes.scatter([config['mean']], [row], s=40, facecolors='none', edgecolors='black',
                         label='mean, no interval (one run or no spread)')
    handles, labels = axes.get_legend_handles_labels()
    if labels:  # one entry per kind of mark, whichever row drew it first
        unique = dict(zip(labels, handles))
        axes.legend(unique.values(), unique.keys(), fontsize=8, loc='best')
    save(figure, study_dir, 'accuracy.png', plt)


def plot_time(study_dir, runs, names, plt):
    rng = np.random.default_rng(0)
    figure, axes = rows_figure(plt, names, 'timed seconds per run',
                               'timed seconds of each run, by device model')
    models = sorted(set(runs['device_model'])) if len(runs) else []
    colours = plt.rcParams['axes.prop_cycle'].by_key()['color']
    for index, model in enumerate(models):
        for row, name in enumerate(names):
            mine = runs[(runs['config'] == name) & (runs['device_model'] == model)]
            axes.scatter(mine['total_time_seconds'], jitter(len(mine), row, rng), s=12,
                         alpha=0.6, color=colours[index % len(colours)],
                         label=model if row == 0 else None)
    if models:
        axes.legend(fontsize=8, title='device model', title_fontsize=8, loc='best')
    save(figure, study_dir, 'time.png', plt)


def plot_epochs(study_dir, speedup, plt):
    """Each curve's mean error with its 95% CI against epochs on log scales, and its fitted law
    over the measured epochs: solid where it fits, dashed where the lack-of-fit test rejects it,
    none where no law fits (fit_status). The axes span the data, not the laws."""
    figure, axes = plt.subplots(figsize=(9, 4.5))
    shown_errors = []
    perfect = 0
    for index, (label, curve) in enumerate(speedup['curves'].items()):
        if 'epochs' not in curve:
            continue
        epochs = np.array(curve['epochs'])
        errors, low, high = error_bars(curve)
        status = fit_status(curve)
        shown = axes.errorbar(epochs, errors, yerr=[errors - low, high - errors],
                              fmt=MARKERS[index // COLOURS % len(MARKERS)], capsize=3, ms=4,
                              label=label + {'fits': '', 'bad fit': ' (bad fit)',
                                                              'none': ' (no law fits)'}[status])
        shown_errors += [v for v in (*errors, *low, *high) if v > 0]
        perfect += int((errors == 0).sum())
        if status != 'none':
            fit = curve['fit']
            grid = np.geomspace(epochs.min(), epochs.max(), 100)
            axes.plot(grid, fit['c'] + fit['b'] * grid ** fit['a'],
                      '-' if status == 'fits' else '--', color=shown.lines[0].get_color(), lw=1)
    axes.set_xscale('log')
    axes.set_yscale('log')
    epochs = sorted({e for curve in speedup['curves'].values() for e in curve.get('epochs', [])})
    axes.set_xticks(epochs, [f'{e:g}' for e in epochs])
    axes.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    if shown_errors:
        low = min(shown_errors) / 1.25
        high = max(shown_errors) * 1.25
        axes.set_ylim(low, high)
        ticks = log_ticks(low, high)
        axes.set_yticks(ticks, [f'{tick:.3g}' for tick in ticks])
        axes.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    axes.set_xlabel('epochs' + (f'  ({perfect} mean errors of 0 lie below the log axis)'
                                if perfect else ''))
    axes.set_ylabel(f"error (1 - {speedup['metric']})")
    axes.set_title('mean error with its 95% CI, and the fitted power laws\n(dashed: the '
                   'lack-of-fit test rejects the law; none where no law fits)', fontsize=9)
    if axes.get_legend_handles_labels()[1]:  # beside the axes: it never hides a point
        axes.legend(fontsize=7, loc='upper left', bbox_to_anchor=(1.01, 1), borderaxespad=0)
    save(figure, study_dir, 'epochs.png', plt)


def error_bars(curve):
    """A curve's mean errors and their 95% CI's ends, within [0, 1] (an interval of a mean
    accuracy may run past 0 or 1; an error cannot)."""
    errors = 1 - np.array(curve['mean_accuracy'], dtype=float)
    low = np.array([np.nan if v is None else 1 - v for v in curve['ci_high']], dtype=float)
    high = np.array([np.nan if v is None else 1 - v for v in curve['ci_low']], dtype=float)
    low = np.where(np.isnan(low), errors, low)
    high = np.where(np.isnan(high), errors, high)
    return errors, np.clip(low, 0, 1), np.clip(high, 0, 1)


def fit_status(curve):
    """'none' (no fit, or one stopped at a bound), 'bad fit' (lack of fit at 5%), else 'fits'."""
    fit = curve.get('fit')
    test = curve.get('lack_of_fit') or {}
    if fit is None or fit['at_bounds']:
        return 'none'
    return 'bad fit' if test.get('p_value') is not None and test['p_value'] < 0.05 else 'fits'


def log_ticks(low, high, most=8):
    """Ticks for a log axis from low to high that never crowd: the most of 1 to 9, 1, 2 and 5,
    or 1 times the powers of 10 that leaves at most `most` in the range; where even the powers
    are too many, every k-th power; where 1 to 9 give fewer than 3 (a range within a decade's
    step), evenly spaced ones (matplotlib's MaxNLocator)."""
    powers = 10.0 ** np.arange(math.floor(math.log10(low)), math.ceil(math.log10(high)) + 1)
    for multipliers in (range(1, 10), (1, 2, 5), (1,)):
        ticks = [float(m * p) for p in powers for m in multipliers if low <= m * p <= high]
        if len(ticks) < 3 and len(multipliers) == 9:
            return [float(t) for t in matplotlib.ticker.MaxNLocator(4).tick_values(low, high)
                    if low <= t <= high]
        if len(ticks) <= most:
            return ticks
    return ticks[::math.ceil(len(ticks) / most)]


def save(figure, study_dir, name, plt):
    figure.tight_layout()
    figure.savefig(StudyDir(study_dir).plot(name), dpi=120)
    plt.close(figure)
