"""A study's plots, from its runs and summary.json's numbers: accuracy.png and time.png (each
configuration's runs, one row per configuration so that long grid names stay legible) and, with an
epoch grid, epochs.png (error against epochs with each point's interval and the fitted laws)."""
import os

import matplotlib
import numpy as np

ROW_INCHES = 0.32  # height of one configuration's row


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
            axes.scatter(kept['accuracy'], jitter(len(kept), row, rng), s=12, alpha=0.5,
                         color='tab:blue', label='a run' if row == 0 else None)
        config = summary['configs'][name]
        if config.get('ci_low') is not None:
            axes.errorbar([config['mean']], [row], color='black', capsize=4, fmt='o',
                          xerr=[[config['mean'] - config['ci_low']],
                                [config['ci_high'] - config['mean']]],
                          label='mean, 95% CI' if row == 0 else None)
    if axes.get_legend_handles_labels()[1]:
        axes.legend(fontsize=8, loc='best')
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
    figure, axes = plt.subplots(figsize=(7, 4.5))
    for label, curve in speedup['curves'].items():
        if 'epochs' not in curve:
            continue
        epochs = np.array(curve['epochs'])
        errors = 1 - np.array(curve['mean_accuracy'])
        low = np.array([np.nan if v is None else 1 - v for v in curve['ci_high']])
        high = np.array([np.nan if v is None else 1 - v for v in curve['ci_low']])
        fit = curve['fit']
        misfit = fit is None or bool(fit['at_bounds'])
        shown = axes.errorbar(epochs, errors, yerr=[np.nan_to_num(errors - low),
                                                    np.nan_to_num(high - errors)],
                              fmt='o', capsize=3, ms=4,
                              label=label + (' (no law fits)' if misfit else ''))
        if fit is not None:
            grid = np.geomspace(epochs.min(), epochs.max(), 100)
            axes.plot(grid, fit['c'] + fit['b'] * grid ** fit['a'], '--' if misfit else '-',
                      color=shown.lines[0].get_color(), lw=1)
    axes.set_xscale('log')
    axes.set_yscale('log')
    epochs = sorted({e for curve in speedup['curves'].values() for e in curve.get('epochs', [])})
    axes.set_xticks(epochs, [f'{e:g}' for e in epochs])
    axes.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    axes.yaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter('%.3g'))
    axes.yaxis.set_minor_formatter(matplotlib.ticker.FormatStrFormatter('%.3g'))
    axes.set_xlabel('epochs')
    axes.set_ylabel(f"error (1 - {speedup['metric']})")
    axes.set_title('mean error with its 95% CI, and the fitted power laws '
                   '(dashed: at a bound)', fontsize=10)
    if axes.get_legend_handles_labels()[1]:
        axes.legend(fontsize=7)
    save(figure, study_dir, 'epochs.png', plt)


def save(figure, study_dir, name, plt):
    figure.tight_layout()
    figure.savefig(os.path.join(study_dir, name), dpi=120)
    plt.close(figure)
