"""A study's outputs, rebuilt from its records: summary.json, report.md, runs.csv and the plots."""
import json
import os

import numpy as np

from . import stats
from .load import failed_runs, load_study, read_study
from .plan import atomic_write


def summarize(study_dir, target=None, require_speedup=False, require_variance=False):
    """summary.json's content, and the table of runs it was computed from."""
    study = read_study(study_dir)
    target = target if target is not None else study.get('target')
    settings = study['settings']
    runs, arrays = load_study(study_dir, outputs=settings['save_logits'])
    speedup = stats.speedup_analysis(runs, study, target) if len(runs) else None
    variance = stats.variance_analysis(runs, arrays) if len(runs) else None
    if require_speedup:
        stats.require(speedup, 'speedup', 'the study needs a grid of 3 or more epoch counts '
                      '(--grid opt.train_epochs=E1,E2,E3) with finished runs')
    if require_variance:
        stats.require(variance, 'variance', 'the study needs saved logits (--save-logits, from its '
                      'first launch) and 2 or more finished runs of a configuration')
    finished, failed = len(runs), failed_runs(study_dir, study)
    expected = len(study['configs']) * study['runs']
    summary = dict(
        status='complete' if finished == expected else 'partial', runs_requested=study['runs'],
        runs_finished=finished, runs_failed=sum(map(len, failed.values())),
        seed=settings['seed'], vary=settings['vary'], target=target,
        accuracy_on='validation' if settings['val_split'] else 'test',
        configs=stats.config_summaries(runs, study, target, failed),
        comparisons=stats.comparisons(runs, study), speedup=speedup, variance=variance,
        launches=[dict(id=launch['id'], started=launch['started'],
                       environment=launch['environment']) for launch in study['launches']])
    return summary, runs


def write_outputs(study_dir, target=None, require_speedup=False, require_variance=False):
    summary, runs = summarize(study_dir, target, require_speedup, require_variance)
    atomic_write(os.path.join(study_dir, 'summary.json'), json.dumps(summary, indent=2))
    atomic_write(os.path.join(study_dir, 'runs.csv'), runs.to_csv(index=False))
    atomic_write(os.path.join(study_dir, 'report.md'), '\n'.join(report_lines(summary)) + '\n')
    plot(study_dir, summary, runs)


def fmt(value, digits=4):
    if value == 'inf':
        return 'inf'
    return '' if value is None else f'{value:.{digits}f}'


def fmt_interval(ci95, digits=4):
    return '' if ci95 is None else f'[{fmt(ci95[0], digits)}, {fmt(ci95[1], digits)}]'


def config_table(summary):
    lines = ['| configuration | n | failed | mean | std | 95% CI | p-value of "mean <= target" | '
             'above target at 5% | timed seconds: mean [95% CI] (device) |',
             '|---|---|---|---|---|---|---|---|---|']
    for name, c in summary['configs'].items():
        times = '; '.join(f"{fmt(t['mean'], 2)} {fmt_interval(t['ci95'], 2)} ({model}, n {t['n']})"
                          for model, t in c['time_by_device'].items())
        decision = {None: '', True: 'yes', False: 'no'}[c['above_target_at_5pct']]
        lines.append(f"| {name} | {c['n']} | {c['failed'] or ''} | {fmt(c['mean'])} | "
                     f"{fmt(c['std'])} | "
                     f"{fmt_interval(c['ci95'])} | {fmt(c['p_mean_at_most_target'], 3)} | "
                     f'{decision} | {times} |')
    return lines


def failure_lines(summary):
    """The failed runs' errors: they are not in the statistics, and the same command retries
    them."""
    failed = {name: c for name, c in summary['configs'].items() if c['failed']}
    if not failed:
        return []
    return ['Failed runs (left out of the statistics; the same command retries them; their '
            'errors are in runs/CONFIG/RUN.failed.json):', '',
            *(f"- {name}: {c['failed']} ({'; '.join(c['failures'])})" for name, c in
              failed.items()), '']


def comparison_table(summary):
    lines = ['| configuration | against | difference of means | 95% CI (Welch) | p (Welch) | '
             'p (paired) | pairs |', '|---|---|---|---|---|---|---|']
    for c in summary['comparisons']:
        lines.append(f"| {c['config']} | {c['baseline']} | {fmt(c['difference'])} | "
                     f"{fmt_interval(c['ci95'])} | {fmt(c['p_welch'], 3)} | "
                     f"{fmt(c['p_paired'], 3)} | {c['n_paired']} |")
    return lines


def speedup_table(speedup):
    lines = [f"Power law error = c + b * epochs^a fitted to each curve's mean errors "
             f"({speedup['metric']}); effective speedup over {speedup['baseline']}: the epochs the baseline's fit needs "
             "for the same error, divided by the epochs, minus 1. 95% bootstrap intervals over "
             f'runs ({stats.RESAMPLES} resamples).', '',
             '| curve | epochs | mean accuracy | the fit\'s accuracy | fit (a, b, c) | '
             'epochs to target [95% CI] | effective speedup [95% CI] |',
             '|---|---|---|---|---|---|---|']
    for label, curve in speedup['curves'].items():
        fit = '{a:.3f}, {b:.4f}, {c:.4f}'.format(**curve['fit'])
        to_target = curve['epochs_to_target']
        target = '' if to_target is None else \
            f"{fmt(to_target['estimate'], 2)} {fmt_interval(to_target['ci95'], 2)}"
        for index, epochs in enumerate(curve['epochs']):
            speed = curve['speedup'].get(str(epochs))
            speed = '' if speed is None else \
                f"{fmt(speed['estimate'], 3)} {fmt_interval(speed['ci95'], 3)}"
            first = index == 0
            lines.append(f"| {label if first else ''} | {epochs:g} | "
                         f"{fmt(curve['mean_accuracy'][index])} | "
                         f"{fmt(curve['fitted_accuracy'][index])} | {fit if first else ''} | "
                         f"{target if first else ''} | {speed} |")
    return lines + [line for label, curve in speedup['curves'].items()
                    for line in ['', misfit_note(label, curve, speedup['baseline'])]
                    if curve['fit']['at_bounds']]


def misfit_note(label, curve, baseline):
    """What a fit stopped at a bound means for the numbers derived from it."""
    miss = max(abs(m - f) for m, f in zip(curve['mean_accuracy'], curve['fitted_accuracy']))
    bounds = ', '.join(curve['fit']['at_bounds'])
    uses = ('its epochs to target and every speedup over it' if label == baseline
            else 'its epochs to target')
    why = (' (its errors fall faster and faster, as in the first epochs of training)'
           if 'c' in curve['fit']['at_bounds'] else '')
    return (f'{label}: the fit stopped at the bound of {bounds} and misses the mean accuracies by '
            f'up to {100 * miss:.2f} points: no power law within the bounds describes this '
            f'curve{why}, so {uses} are not measurements.')


def variance_table(variance):
    lines = ['| configuration | TTA | n | mean accuracy | test-set std | distribution-wise std | '
             'CACE |', '|---|---|---|---|---|---|---|']
    for config, entries in variance.items():
        for key, entry in entries.items():
            lines.append(f"| {config} | {'yes' if key == 'tta' else 'no'} | {entry['n']} | "
                         f"{fmt(entry['mean'])} | {fmt(entry['test_set_std'])} | "
                         f"{fmt(entry['distribution_wise_std'])} | {fmt(entry['cace'])} |")
    return lines


def report_lines(summary):
    target = summary['target']
    lines = [f"# Study: {summary['accuracy_on']} accuracy with TTA", '',
             f"{summary['runs_finished']} runs finished ({summary['status']}); seeds from "
             f"{summary['seed']}, varying {summary['vary']}.", '', *config_table(summary), '',
             *failure_lines(summary),
             'std: between runs. 95% CI: of the mean (Student\'s t). Timed seconds per device '
             'model, never averaged across models.']
    if target is not None:
        lines.append(f'Target {target}: the p-value is that of the one-sided t-test of "mean <= '
                     f'{target}"; a small p-value is evidence that the mean exceeds the target, '
                     'and "above target at 5%" says whether p < 0.05.')
    if summary['comparisons']:
        lines += ['', '## Comparisons', '', *comparison_table(summary), '',
                  'Each configuration against the first at the same grid point: Welch\'s t-test '
                  'and the paired t-test over runs with the same seeds.']
    if summary['speedup']:
        lines += ['', '## Epochs to target and effective speedup', '',
                  *speedup_table(summary['speedup']), '', '![epochs](epochs.png)']
    if summary['variance']:
        lines += ['', '## Variance and calibration', '', *variance_table(summary['variance']), '',
                  'Test-set std: between runs. Distribution-wise std: the part of it that is not '
                  'the sampling of the test set (Jordan 2024). CACE: class-aggregated calibration '
                  'error of the ensemble of runs (Jiang et al. 2021).']
    lines += ['', '## Launches', '']
    for launch in summary['launches']:
        environment = ', '.join(f'{k} {v}' for k, v in launch['environment'].items()
                                if v not in (None, 0, {}))
        lines.append(f"- {launch['started']} ({launch['id']}): {environment}")
    lines += ['', '![accuracy](accuracy.png) ![time](time.png)']
    return lines


def plot(study_dir, summary, runs):
    """Each configuration's accuracies (points, with the mean and its 95% CI) and timed seconds
    (by device model); with an epoch grid, error against epochs with the fitted power laws."""
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    names = list(summary['configs'])
    for key, label, filename in (
            ('accuracy', f"{summary['accuracy_on']} accuracy (TTA)", 'accuracy.png'),
            ('total_time_seconds', 'timed seconds per run', 'time.png')):
        figure, axes = plt.subplots(figsize=(2 + 1.0 * len(names), 4))
        for x, name in enumerate(names):
            mine = runs[runs['config'] == name] if len(runs) else runs
            for model, group in (mine.groupby('device_model') if len(mine) else []):
                axes.scatter([x] * len(group), group[key], alpha=0.5, s=14, label=model
                             if key != 'accuracy' and x == 0 else None)
            config = summary['configs'][name]
            if key == 'accuracy' and config['ci95'] is not None:
                low, high = config['ci95']
                axes.errorbar([x + 0.15], [config['mean']], color='black', capsize=4, fmt='o',
                              yerr=[[config['mean'] - low], [high - config['mean']]])
        axes.set_xticks(range(len(names)), names, rotation=30 if len(names) > 4 else 0,
                        ha='right' if len(names) > 4 else 'center')
        axes.set_ylabel(label)
        axes.set_title(label + (' (mean, 95% CI)' if key == 'accuracy' else ''))
        figure.tight_layout()
        figure.savefig(os.path.join(study_dir, filename), dpi=120)
        plt.close(figure)
    if summary['speedup']:
        plot_epochs(study_dir, summary['speedup'], plt)


def plot_epochs(study_dir, speedup, plt):
    figure, axes = plt.subplots(figsize=(6, 4))
    for label, curve in speedup['curves'].items():
        epochs = np.array(curve['epochs'])
        errors = 1 - np.array(curve['mean_accuracy'])
        misfit = bool(curve['fit']['at_bounds'])
        line = axes.plot(epochs, errors, 'o',
                         label=label + (' (fit at a bound: no law fits)' if misfit else ''))[0]
        fit = curve['fit']
        grid = np.geomspace(epochs.min(), epochs.max(), 100)
        axes.plot(grid, fit['c'] + fit['b'] * grid ** fit['a'], '--' if misfit else '-',
                  color=line.get_color())
    axes.set_xscale('log')
    axes.set_yscale('log')
    axes.set_xlabel('epochs')
    axes.set_ylabel(f"error (1 - {speedup['metric']})")
    axes.set_title('error against epochs, with power-law fits')
    axes.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(os.path.join(study_dir, 'epochs.png'), dpi=120)
    plt.close(figure)
