"""The statistics of a study, from its table of runs (load_study): each configuration's accuracy
and its test against a target, comparisons between configurations, times per device model, epochs
to a target and effective speedups over an epoch grid, and variance and calibration from saved
logits. scipy.stats for the tests and intervals; studylib.fits and studylib.variance for the rest."""
import math
import warnings

import numpy as np
from scipy import stats

from . import fits, variance
from .errors import StudyError

EPOCHS_KEY = 'opt.train_epochs'
RESAMPLES = 1000  # bootstrap resamples of the report's intervals (each a power-law fit)


def finite_or_none(value):
    """scipy's nan (as for samples without spread) as None, which JSON holds."""
    return float(value) if value is not None and math.isfinite(value) else None


def describe(values):
    """n, mean, sample standard deviation and the 95% confidence interval of the mean (Student's
    t); None where a sample is too small or has no spread."""
    values = [float(v) for v in values]
    n = len(values)
    entry = dict(n=n, mean=float(np.mean(values)) if n else None, std=None, ci95=None)
    if n > 1:
        with warnings.catch_warnings():  # samples without spread: scipy warns, gives nan (None)
            warnings.simplefilter('ignore', RuntimeWarning)
            interval = stats.t.interval(0.95, n - 1, loc=entry['mean'], scale=stats.sem(values))
            entry['std'] = finite_or_none(stats.tstd(values))
        entry['ci95'] = [finite_or_none(bound) for bound in interval]
        if None in entry['ci95']:
            entry['ci95'] = None
    return entry


def target_test(values, target):
    """The one-sided t-test of the null hypothesis 'mean <= target' (a record is claimed when it is
    rejected): its p-value, and whether the mean exceeds the target at the 5% level."""
    if target is None or len(values) < 2:
        return dict(p_mean_at_most_target=None, above_target_at_5pct=None)
    with warnings.catch_warnings():
        warnings.simplefilter('ignore', RuntimeWarning)
        p = finite_or_none(stats.ttest_1samp(values, target, alternative='greater').pvalue)
    return dict(p_mean_at_most_target=p, above_target_at_5pct=None if p is None else p < 0.05)


def time_by_device(runs):
    """Timed seconds per device model (mean and 95% CI): a mixed cluster is not averaged."""
    return {model: describe(group['total_time_seconds'])
            for model, group in runs.groupby('device_model', sort=True)}


def config_summaries(runs, study, target, failed):
    """Per configuration: its accuracies described and tested against the target, its times per
    device model, and its failed runs (kept out of the statistics; a later launch retries them)."""
    summaries = {}
    for config in study['configs']:
        mine = runs[runs['config'] == config] if len(runs) else runs
        accuracies = list(mine['accuracy']) if len(mine) else []
        errors = sorted({f"{entry['failures'][-1]['error_type']}: "
                         f"{(entry['failures'][-1]['error'].splitlines() or [''])[0][:200]}"
                         for entry in failed.get(config, [])})
        summaries[config] = dict(**describe(accuracies), **target_test(accuracies, target),
                                 time_by_device=time_by_device(mine) if len(mine) else {},
                                 failed=len(failed.get(config, [])), failures=errors)
    return summaries


def comparison(ours, theirs):
    """ours against theirs ({run: accuracy}): the difference of means with its Welch 95% CI,
    Welch's t-test, and the paired t-test over the runs both finished (same seeds)."""
    shared = sorted(set(ours) & set(theirs))
    entry = dict(difference=None, ci95=None, p_welch=None, p_paired=None, n_paired=len(shared))
    if ours and theirs:
        entry['difference'] = float(np.mean(list(ours.values())) - np.mean(list(theirs.values())))
    with warnings.catch_warnings():
        warnings.simplefilter('ignore', RuntimeWarning)
        if len(ours) > 1 and len(theirs) > 1:
            welch = stats.ttest_ind(list(ours.values()), list(theirs.values()), equal_var=False)
            interval = welch.confidence_interval(0.95)
            ci95 = [finite_or_none(interval.low), finite_or_none(interval.high)]
            entry.update(ci95=None if None in ci95 else ci95, p_welch=finite_or_none(welch.pvalue))
        if len(shared) > 1:
            entry['p_paired'] = finite_or_none(stats.ttest_rel(
                [ours[run] for run in shared], [theirs[run] for run in shared]).pvalue)
    return entry


def comparisons(runs, study):
    """Each configuration against the first configuration at the same grid point (without grids:
    against the first configuration)."""
    configs = study['configs']
    bases = list(dict.fromkeys(config['base'] for config in configs.values()))
    by_config = {name: dict(zip(group['run'], group['accuracy']))
                 for name, group in runs.groupby('config')} if len(runs) else {}
    found = []
    for name, config in configs.items():
        if config['base'] == bases[0]:
            continue
        baseline = next((other for other, c in configs.items()
                         if c['base'] == bases[0] and c['grid'] == config['grid']), None)
        if baseline is not None:
            found.append(dict(config=name, baseline=baseline, **comparison(
                by_config.get(name, {}), by_config.get(baseline, {}))))
    return found


def epoch_curves(runs, study, metric='accuracy'):
    """{base: {epochs: per-run accuracies}} of the configurations of an epoch grid (grid points
    that differ only in their epochs), or {} when the study has none."""
    curves = {}
    for name, config in study['configs'].items():
        if EPOCHS_KEY not in config['grid']:
            continue
        rest = {k: v for k, v in config['grid'].items() if k != EPOCHS_KEY}
        label = ','.join([config['base'], *(f'{k}={v}' for k, v in rest.items())])
        values = runs.loc[runs['config'] == name, metric] if len(runs) else []
        if len(values):
            curves.setdefault(label, {})[float(config['hyp']['opt']['train_epochs'])] = list(values)
    return {label: curve for label, curve in curves.items() if len(curve) >= 3}


def interval(result):
    return dict(estimate=finite_or_none(result.estimate) if math.isfinite(result.estimate)
                else 'inf', ci95=[finite_or_none(result.low), finite_or_none(result.high)
                                  if math.isfinite(result.high) else 'inf'],
                failed_resamples=result.failed, unreachable_resamples=result.unreachable)


def speedup_analysis(runs, study, target, metric='accuracy'):
    """Per curve of an epoch grid: its power-law fit of error against epochs, the epochs to the
    target, and the effective speedup over the first curve at each of its epoch counts, each with
    a 95% bootstrap interval over runs. None when the study has no epoch grid of 3 or more
    counts."""
    curves = epoch_curves(runs, study, metric)
    if not curves:
        return None
    baseline_label, baseline = next(iter(curves.items()))
    analysis = {}
    with warnings.catch_warnings():
        warnings.simplefilter('ignore', RuntimeWarning)
        for label, curve in curves.items():
            epochs = sorted(curve)
            means = [float(np.mean(curve[e])) for e in epochs]
            law = fits.fit_power_law(epochs, [1 - m for m in means])
            entry = dict(epochs=epochs, mean_accuracy=means,
                         fitted_accuracy=[float(1 - law.error_at(e)) for e in epochs],
                         fit=dict(a=law.a, b=law.b, c=law.c, at_bounds=list(law.at_bounds)),
                         epochs_to_target=None, speedup={})
            if target is not None:
                entry['epochs_to_target'] = interval(fits.bootstrap_epochs_to_accuracy(
                    curve, target, resamples=RESAMPLES))
            if label != baseline_label:
                entry['speedup'] = {str(e): interval(fits.bootstrap_effective_speedup(
                    baseline, curve[e], e, resamples=RESAMPLES)) for e in epochs}
            analysis[label] = entry
    return dict(metric=metric, baseline=baseline_label, target=target, curves=analysis)


def variance_analysis(runs, arrays):
    """Per configuration with saved logits, with TTA and without: mean accuracy, test-set standard
    deviation, distribution-wise standard deviation and class-aggregated calibration error (the
    paper's variance table). None when no logits were saved."""
    if not arrays.get('logits') or 'test_labels' not in arrays:
        return None
    labels, analysis = arrays['test_labels'], {}
    for config in dict.fromkeys(runs['config']):
        keys = [(config, run) for run in runs.loc[runs['config'] == config, 'run']
                if (config, run) in arrays['logits']]
        if len(keys) < 2:
            continue
        for tta, key in ((True, 'logits'), (False, 'logits_plain')):
            predictions = np.stack([arrays[key][k].argmax(1) for k in keys])
            correct = predictions == labels
            analysis.setdefault(config, {})['tta' if tta else 'no_tta'] = dict(
                n=len(keys), mean=float(correct.mean()),
                test_set_std=variance.test_set_std(correct.mean(axis=1)),
                distribution_wise_std=variance.distribution_wise_std(correct),
                cace=variance.class_aggregated_calibration_error(predictions, labels))
    return analysis


def require(analysis, name, fix):
    if analysis is None:
        raise StudyError(f'no {name} analysis: {fix}')
    return analysis
