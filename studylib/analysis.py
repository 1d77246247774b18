"""A study's analyses, from its table of runs (load_study) and what study.json says of its
configurations: each configuration's accuracy and times, the comparisons between configurations,
epochs to a target and effective speedups over an epoch grid, and variance and calibration from
saved logits. The statistics themselves are studylib.inference's, studylib.fits' and
studylib.variance's; this module chooses what to compare and how.

Every analysis returns what it found, or {'reason': why it is not there}: no analysis raises for
data that admit no answer (a flat curve, a diverged configuration, a single epoch count).
"""
import math
import traceback

import numpy as np

from . import fits, inference

EPOCHS_KEY = 'opt.train_epochs'
POWER = 0.8  # the power at which planning figures are given
TTA_NAMES = {0: 'none', 1: 'mirror', 2: 'six views'}


def section(function, *args, **kwargs):
    """function's result, or {'reason': ...} naming the error that stopped it: one analysis that
    fails leaves the others (and the report) standing."""
    try:
        return function(*args, **kwargs)
    except Exception as error:  # noqa: BLE001: any failure of one analysis is reported, not fatal
        where = traceback.extract_tb(error.__traceback__)[-1]
        return {'reason': f'the analysis failed ({type(error).__name__}: {error}; at '
                          f'{where.filename.rsplit("/", 1)[-1]}:{where.lineno})'}


def finished(runs, config):
    """A configuration's finished runs that did not diverge (the statistics' runs), and the number
    that diverged (a loss not finite: their accuracy says nothing of the method's mean)."""
    if not len(runs):
        return runs, 0
    mine = runs[runs['config'] == config]
    diverged = mine['diverged'].fillna(False).astype(bool) if 'diverged' in mine else \
        np.zeros(len(mine), dtype=bool)
    return mine[~diverged], int(diverged.sum())


def tta_of(hyp):
    """The TTA a configuration's accuracy is measured with, from its hyp: level 0, 1 or 2, and the
    share of test images it is spent on where the method chooses them (tta_fraction)."""
    net = hyp.get('net', {})
    level = net.get('tta_level')
    name = TTA_NAMES.get(level, str(level))
    fraction = net.get('tta_fraction')
    if fraction is not None and level:
        name += f' on the least confident {fraction:.0%}' if fraction < 1 else ''
    return dict(level=level, fraction=fraction, name=name)


def time_by_device(runs):
    """Timed seconds per device model (describe): a mixed cluster is never averaged."""
    return {model: inference.describe(group['total_time_seconds'])
            for model, group in runs.groupby('device_model', sort=True)} if len(runs) else {}


def config_summary(runs, name, config, target, failures):
    """One configuration: its accuracies described and tested against the target (diverged runs
    counted and left out), its TTA, its times per device model and its failed runs (failures:
    the RUN.failed.json of each, whose last try's error is shown)."""
    mine, diverged = finished(runs, name)
    accuracies = list(mine['accuracy']) if len(mine) else []
    entry = dict(inference.describe(accuracies), diverged=diverged, tta=tta_of(config.hyp),
                 time_by_device=time_by_device(mine), failed=len(failures),
                 failures=sorted({f"{last['error_type']}: "
                                  f"{(last['error'].splitlines() or [''])[0][:200]}"
                                  for last in (entry['failures'][-1] for entry in failures)}))
    if target is not None:
        test = inference.target_test(accuracies, target)
        entry.update(p_mean_at_most_target=test['p_value'], target_reason=test['reason'],
                     above_target_at_5pct=None if test['p_value'] is None
                     else test['p_value'] < 0.05)
    return entry


def config_summaries(runs, configs, target, failed):
    return {name: section(config_summary, runs, name, config, target, failed.get(name, []))
            for name, config in configs.items()}


def comparison_pairs(configs):
    """(configuration, its baseline) for every comparison of the study: each configuration against
    the first configuration at the same grid point; in a study of one configuration over grids,
    each grid point against the first."""
    names = list(configs)
    bases = list(dict.fromkeys(config.base for config in configs.values()))
    if len(bases) == 1:
        return [(name, names[0]) for name in names[1:]]
    pairs = []
    for name, config in configs.items():
        if config.base == bases[0]:
            continue
        baseline = next((other for other, c in configs.items()
                         if c.base == bases[0] and c.grid == config.grid), None)
        if baseline is not None:
            pairs.append((name, baseline))
    return pairs


def paired_runs(mine, theirs):
    """The runs of two configurations that share their run number and every seed (study.py gives
    run i of every configuration the same seeds): {run: (baseline's accuracy, config's)}, and
    whether the design pairs them (every shared run has the same seeds)."""
    seeds = [column for column in mine.columns if column.startswith('seed_')]
    ours = mine.set_index('run')
    base = theirs.set_index('run')
    shared = sorted(set(ours.index) & set(base.index))
    same = all(all(ours.at[run, s] == base.at[run, s] for s in seeds) for run in shared)
    return {run: (base.at[run, 'accuracy'], ours.at[run, 'accuracy']) for run in shared}, \
        bool(shared) and bool(seeds) and same


def compare_configs(runs, config, baseline, resolve):
    """config against baseline: the test the design calls for (paired over runs with the same
    seeds, else Welch), the other test (for summary.json only), planning figures, and the ratio
    of their times per device model."""
    mine, _ = finished(runs, config)
    theirs, _ = finished(runs, baseline)
    pairs, paired = paired_runs(mine, theirs)
    welch = inference.compare(theirs['accuracy'], mine['accuracy'])
    if paired and len(pairs) >= 2:
        primary = inference.compare(*zip(*pairs.values()), paired=True)
        other = welch
    else:
        primary, other = welch, None
    std = math.sqrt((np.var(mine['accuracy'], ddof=1) + np.var(theirs['accuracy'], ddof=1)) / 2) \
        if min(len(mine), len(theirs)) > 1 else None
    entry = dict(config=config, baseline=baseline, design='paired' if other else 'unpaired',
                 **primary, other_test=other, std=std,
                 runs_to_resolve_difference=plan_runs(std, primary, primary['difference']),
                 time_ratio_by_device=time_ratios(mine, theirs))
    if resolve is not None:  # points of accuracy, the statistics' fractions times 100
        entry['runs_to_resolve'] = plan_runs(std, primary, resolve / 100)
    return entry


def plan_runs(std, result, difference):
    """Runs per configuration at which the comparison's test detects `difference` with
    POWER, at the observed std (and within-pair correlation for paired runs)."""
    if not std or not difference:
        return None
    correlation = result.get('correlation')
    return inference.runs_needed(std, difference, power=POWER,
                                 paired=result['test'] == 'paired t-test',
                                 correlation=min(max(correlation or 0.0, -0.99), 0.99))


def time_ratios(mine, theirs):
    ratios = {}
    for model in sorted(set(mine['device_model']) & set(theirs['device_model'])):
        ratios[model] = inference.time_ratio(
            theirs.loc[theirs['device_model'] == model, 'total_time_seconds'],
            mine.loc[mine['device_model'] == model, 'total_time_seconds'])
    return ratios


def comparisons(runs, configs, resolve=None):
    """Every comparison of the study, with Holm's adjustment of their p-values over the family of
    this study's comparisons (the family is named in the result). resolve: a difference in points
    of accuracy (0.1 = 0.001) for which each comparison gets the runs needed to detect it."""
    pairs = comparison_pairs(configs)
    if not pairs:
        return {'reason': 'one configuration at one grid point: nothing to compare'}
    found = [dict(section(compare_configs, runs, config, baseline, resolve), config=config,
                  baseline=baseline) for config, baseline in pairs]
    adjusted = inference.holm([entry.get('p_value') for entry in found])
    for entry, p in zip(found, adjusted):
        entry['p_holm'] = p
    return dict(family=f"the {len(found)} comparisons of this study, each configuration against "
                       'its baseline (Holm 1979)', comparisons=found, resolve=resolve)


def epoch_curves(runs, configs, metric='accuracy'):
    """{curve: {epochs: per-run values}} for the configurations of an epoch grid (grid points that
    differ only in their epochs; diverged runs left out), or {'reason': ...}."""
    curves = {}
    for name, config in configs.items():
        if EPOCHS_KEY not in config.grid:
            continue
        rest = {k: v for k, v in config.grid.items() if k != EPOCHS_KEY}
        label = ','.join([config.base, *(f'{k}={v}' for k, v in rest.items())])
        values = finished(runs, name)[0]
        values = list(values[metric]) if len(values) else []
        if values:
            curves.setdefault(label, {})[float(config.hyp['opt']['train_epochs'])] = values
    return curves


def curve_entry(curve, target, baseline, baseline_label, is_baseline):
    """One curve: per epoch count its n, mean and interval; its fit; the epochs to the target and
    the speedup over the baseline curve at each epoch count, each with its interval."""
    epochs = sorted(curve)
    points = [inference.describe(curve[e]) for e in epochs]
    entry = dict(baseline=baseline_label, epochs=epochs, n=[p['n'] for p in points],
                 mean_accuracy=[p['mean'] for p in points],
                 ci_low=[p['ci_low'] for p in points], ci_high=[p['ci_high'] for p in points],
                 fit=None, fitted_accuracy=None, epochs_to_target=None, speedup={})
    try:
        law = fits.fit_power_law(epochs, [1 - p['mean'] for p in points])
        entry.update(fit=dict(a=law.a, b=law.b, c=law.c, at_bounds=list(law.at_bounds)),
                     fitted_accuracy=[float(1 - law.error_at(e)) for e in epochs])
    except ValueError as error:
        entry['fit_reason'] = str(error)
    if target is not None:
        entry['epochs_to_target'] = fits.epochs_to_accuracy_interval(curve, target)
    if not is_baseline and baseline is not None:
        entry['speedup'] = {str(e): fits.effective_speedup_interval(baseline, curve[e], e)
                            for e in epochs}
    return entry


def speedup_analysis(runs, configs, target, metric='accuracy', baselines=None):
    """Per curve of an epoch grid (3 or more epoch counts): its power-law fit, the epochs to the
    target and the effective speedup over its baseline curve (baselines: {curve: baseline curve};
    default the first curve), with intervals; {'reason': ...} when the study has no such grid."""
    curves = epoch_curves(runs, configs, metric)
    usable = {label: curve for label, curve in curves.items() if len(curve) >= fits.MIN_EPOCH_COUNTS}
    if not usable:
        counts = ', '.join(f'{label}: {len(curve)}' for label, curve in curves.items())
        return {'reason': 'the study needs a grid of 3 or more epoch counts '
                          f'(--grid {EPOCHS_KEY}=E1,E2,E3) with finished runs'
                          + (f'; epoch counts: {counts}' if counts else '')}
    first = next(iter(usable))
    baseline_of = {label: (baselines or {}).get(label, first) for label in usable}
    analysis = {label: section(curve_entry, curve, target, usable.get(baseline_of[label]),
                               baseline_of[label], label == baseline_of[label])
                for label, curve in usable.items()}
    return dict(metric=metric, baseline=first, target=target, curves=analysis,
                skipped={label: len(curve) for label, curve in curves.items()
                         if label not in usable})
