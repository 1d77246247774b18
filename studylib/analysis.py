"""A study's analyses, from its table of runs (load_study) and study.json's configurations: each
configuration's accuracy and times, the comparisons, epochs to a target and effective speedups
over an epoch grid. The statistics are studylib.stats'; this module chooses what to compare and how.

Every analysis returns what it found, or {'reason': why it is not there}: none raises for data
that admit no answer (a flat curve, a diverged configuration, a single epoch count).
"""
import math
import traceback

import numpy as np
import pandas as pd

from .stats import fits, inference

EPOCHS_KEY = 'opt.train_epochs'
POWER = 0.8  # the power at which planning figures are given
ALPHA = 0.05  # the level of every claim: a target, a difference, an equivalence
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


def between_runs(runs):
    """The engine's time between runs, per launch: the mean gap from a run's finish to the next
    start of the same process, the mean run, their ratio; older records (no start) left out."""
    if not len(runs) or 'started' not in runs:
        return {}
    timed = runs.dropna(subset=['started']).assign(
        started=lambda frame: pd.to_datetime(frame['started']),
        finished=lambda frame: pd.to_datetime(frame['finished']))
    found = {}
    for launch, group in timed.groupby('launch', sort=False):
        seconds = (group['finished'] - group['started']).dt.total_seconds()
        gaps = []
        for _, process in group.sort_values('started').groupby('rank'):
            gaps += list((process['started'].iloc[1:].to_numpy() -
                          process['finished'].iloc[:-1].to_numpy()) / np.timedelta64(1, 's'))
        if gaps:
            found[launch] = dict(gap_seconds=float(np.mean(gaps)), gaps=len(gaps),
                                 run_seconds=float(seconds.mean()),
                                 fraction=float(np.mean(gaps) / seconds.mean()))
    return found


def compile_costs(records):
    """What compiling cost a launch, per configuration and CompileRecord.stage: the processes,
    their seconds (mean, largest), the graphs dynamo traced (the most in one process), inductor's
    compiled and from_cache (summed) and how each process's stage went (CompileRecord.came_from)."""
    if not records:
        return []
    table = pd.DataFrame([dict(record.to_json(), came_from=record.came_from())
                          for record in records])
    costs = []
    for (config, stage), group in table.groupby(['config', 'stage'], sort=False):
        costs.append(dict(config=config, stage=stage, processes=len(group),
                          seconds_mean=float(group['seconds'].mean()),
                          seconds_max=float(group['seconds'].max()),
                          graphs=int(group['graphs'].max()), compiled=int(group['compiled'].sum()),
                          from_cache=int(group['from_cache'].sum()),
                          came_from=group['came_from'].value_counts().sort_index().to_dict()))
    return costs


def diverged_accuracies(runs, config):
    """The accuracies a configuration's diverged runs ended with (a record counts every run)."""
    if not len(runs) or 'diverged' not in runs:
        return []
    mine = runs[(runs['config'] == config) & runs['diverged'].fillna(False).astype(bool)]
    return list(mine['accuracy'].astype(float)) if len(mine) else []


def config_summary(runs, name, config, failures):
    """One configuration: its accuracies described (diverged runs left out; the target claims
    count them), TTA, times per device model and failed runs (failures: each RUN.failed.json)."""
    mine, diverged = finished(runs, name)
    accuracies = list(mine['accuracy']) if len(mine) else []
    return dict(inference.describe(accuracies), diverged=diverged, tta=tta_of(config.hyp),
                time_by_device=time_by_device(mine), failed=len(failures),
                failures=sorted({f"{last['error_type']}: "
                                 f"{(last['error'].splitlines() or [''])[0][:200]}"
                                 for last in (entry['failures'][-1] for entry in failures)}))


def config_summaries(runs, configs, failed):
    return {name: section(config_summary, runs, name, config, failed.get(name, []))
            for name, config in configs.items()}


def target_claim(runs, config, target):
    """A configuration's record claim against the target (inference.target_test), counting every
    run it trained: its diverged runs enter at the accuracy they ended with."""
    mine, _ = finished(runs, config)
    return inference.target_test(list(mine['accuracy']) if len(mine) else [], target,
                                 diverged=diverged_accuracies(runs, config))


def target_claims(runs, configs, target):
    """Every configuration's claim "its mean accuracy exceeds the target", with Holm's adjustment
    over the family of these claims (one per configuration with a defined test): with five
    configurations truly at the target and n = 10, one at least reads "above" 22.6% of the time
    unadjusted (simulated), 5% adjusted. above_target: p_holm < ALPHA."""
    if target is None:
        return {'reason': 'no target: give --target ACC in the launch, before the runs are seen'}
    claims = {name: section(target_claim, runs, name, target) for name in configs}
    tested = [claim for claim in claims.values() if 'p_value' in claim]
    for claim, p in zip(tested, inference.holm([claim['p_value'] for claim in tested])):
        claim.update(p_holm=p, above_target=None if p is None else p < ALPHA)
    defined = sum(claim['p_value'] is not None for claim in tested)
    return dict(target=target, alpha=ALPHA, claims=claims,
                family=f'the {defined} target claims of this study, one per configuration with a '
                       'defined test (Holm 1979)')


def comparison_pairs(configs):
    """(configuration, its baseline) of every comparison: each configuration against the first at
    the same grid point; in a one-configuration study over grids, each point against the first."""
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
    """{run: (baseline's accuracy, config's)} of the runs two configurations share, and whether
    the design pairs them (every shared run has the same seeds, as study.py gives them)."""
    seeds = [column for column in mine.columns if column.startswith('seed_')]
    ours = mine.set_index('run')
    base = theirs.set_index('run')
    shared = sorted(set(ours.index) & set(base.index))
    same = all(all(ours.at[run, s] == base.at[run, s] for s in seeds) for run in shared)
    return {run: (base.at[run, 'accuracy'], ours.at[run, 'accuracy']) for run in shared}, \
        bool(shared) and bool(seeds) and same


def compare_configs(runs, config, baseline, resolve, margin=None, time_margin=None):
    """config against baseline: the test the design calls for (paired over runs with the same
    seeds, else Welch) and the other (summary.json only), time ratios per device model, the runs
    to resolve `resolve`, and the TOSTs of accuracy (margin, points) and time (time_margin)."""
    mine, _ = finished(runs, config)
    theirs, _ = finished(runs, baseline)
    pairs, paired = paired_runs(mine, theirs)
    welch = inference.compare(theirs['accuracy'], mine['accuracy'])
    if paired and len(pairs) >= 2:
        primary = inference.compare(*zip(*pairs.values()), paired=True)
        other = welch
    else:
        primary = welch
        other = None
    std = math.sqrt((np.var(mine['accuracy'], ddof=1) + np.var(theirs['accuracy'], ddof=1)) / 2) \
        if min(len(mine), len(theirs)) > 1 else None
    entry = dict(config=config, baseline=baseline, design='paired' if other else 'unpaired',
                 **primary, other_test=other, std=std,
                 time_ratio_by_device=time_ratios(mine, theirs))
    if resolve is not None:  # points of accuracy, the statistics' fractions times 100
        entry['runs_to_resolve'] = plan_runs(std, primary, resolve / 100)
    if margin is not None:
        base, ours = zip(*pairs.values()) if other else (theirs['accuracy'], mine['accuracy'])
        entry['equivalence'] = inference.equivalence_test(base, ours, margin / 100,
                                                          paired=bool(other), alpha=ALPHA)
    if time_margin is not None:
        entry['time_equivalence_by_device'] = time_equivalences(mine, theirs, time_margin)
    return entry


def plan_runs(std, result, difference):
    """Runs per configuration at which the comparison's test detects `difference` with POWER, at
    the observed std (and correlation), `difference` fixed before the data: power computed from
    the observed difference is a function of its p-value and says nothing more."""
    if not std or not difference:
        return None
    correlation = result.get('correlation')
    return inference.runs_needed(std, difference, power=POWER,
                                 paired=result['test'] == 'paired t-test',
                                 correlation=min(max(correlation or 0.0, -0.99), 0.99))


def per_device(mine, theirs, function):
    """function(baseline's seconds, configuration's seconds) per device model both ran on."""
    return {model: function(theirs.loc[theirs['device_model'] == model, 'total_time_seconds'],
                            mine.loc[mine['device_model'] == model, 'total_time_seconds'])
            for model in sorted(set(mine['device_model']) & set(theirs['device_model']))}


def time_ratios(mine, theirs):
    return per_device(mine, theirs, inference.time_ratio)


def time_equivalences(mine, theirs, time_margin):
    """Per device model, the TOST of the geometric-mean time ratio within time_margin either way."""
    return per_device(mine, theirs, lambda a, b: inference.equivalence_test(
        a, b, time_margin, ratio=True, alpha=ALPHA))


def comparisons(runs, configs, resolve=None, margin=None, time_margin=None):
    """Every comparison of the study, Holm-adjusted over the family of its comparisons (named in
    the result) and, apart, over its equivalence tests. resolve: a difference in points of
    accuracy (0.1 = 0.001) fixed in advance, for which each comparison gets the runs needed;
    margin (points of accuracy) and time_margin (a ratio of times): the equivalence margins."""
    pairs = comparison_pairs(configs)
    if not pairs:
        return {'reason': 'one configuration at one grid point: nothing to compare'}
    found = [dict(section(compare_configs, runs, config, baseline, resolve, margin, time_margin),
                  config=config, baseline=baseline) for config, baseline in pairs]
    adjusted = inference.holm([entry.get('p_value') for entry in found])
    for entry, p in zip(found, adjusted):
        entry['p_holm'] = p
    equivalences = [test for entry in found for test in
                    [entry.get('equivalence'), *(entry.get('time_equivalence_by_device') or {})
                     .values()] if test is not None]
    for test, p in zip(equivalences, inference.holm([test['p_value'] for test in equivalences])):
        test.update(p_holm=p, equivalent=None if p is None else p < ALPHA)
    return dict(family=f"the {len(found)} comparisons of this study, each configuration against "
                       'its baseline (Holm 1979)', comparisons=found, resolve=resolve,
                margin=margin, time_margin=time_margin,
                equivalence_family=f"the {sum(t['p_value'] is not None for t in equivalences)} "
                                   'equivalence tests of this study that could be made (Holm '
                                   '1979)' if equivalences else None)


def epoch_curves(runs, configs, metric='accuracy'):
    """{curve: {epochs: its finished runs with the metric, diverged ones left out}} for the
    configurations of an epoch grid (grid points that differ only in their epochs)."""
    curves = {}
    for name, config in configs.items():
        if EPOCHS_KEY not in config.grid:
            continue
        rest = {k: v for k, v in config.grid.items() if k != EPOCHS_KEY}
        label = ','.join([config.base, *(f'{k}={v}' for k, v in rest.items())])
        mine = finished(runs, name)[0]
        mine = mine[mine[metric].notna()] if len(mine) else mine
        if len(mine):
            curves.setdefault(label, {})[float(config.hyp['opt']['train_epochs'])] = mine
    return curves


def matched_cells(frames, metric):
    """The cells' per-run values and whether the design pairs them: paired when 2 or more runs
    with the same seeds are in every cell, each cell then holding those runs in one order (a
    partial study's other runs left out); else every run of each cell, unpaired."""
    seeds = [column for column in frames[0].columns if column.startswith('seed_')]
    indexed = [frame.set_index('run') for frame in frames]
    shared = sorted(set.intersection(*(set(frame.index) for frame in indexed)))
    if seeds and len(shared) >= 2 and all(
            (frame.loc[shared, seeds].to_numpy() == indexed[0].loc[shared, seeds].to_numpy())
            .all() for frame in indexed[1:]):
        return [frame.loc[shared, metric].to_numpy(dtype=float) for frame in indexed], True
    return [frame[metric].to_numpy(dtype=float) for frame in frames], False


def curve_entry(curve, target, baseline, baseline_label, is_baseline, metric='accuracy'):
    """One curve: per epoch count its n, mean and interval; its fit and lack-of-fit test; epochs to
    the target and the speedup over the baseline curve at each epoch count, with intervals."""
    epochs = sorted(curve)
    points = [inference.describe(curve[e][metric].to_numpy(dtype=float)) for e in epochs]
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
    cells, paired = matched_cells([curve[e] for e in epochs], metric)
    entry.update(design='paired' if paired else 'unpaired',
                 lack_of_fit=fits.lack_of_fit(epochs, cells, paired))
    if target is not None:
        entry['epochs_to_target'] = fits.epochs_to_accuracy_interval(dict(zip(epochs, cells)),
                                                                     target, paired=paired)
    if not is_baseline and baseline is not None:
        baseline_epochs = sorted(baseline)
        for e in epochs:
            cells, paired = matched_cells([baseline[b] for b in baseline_epochs] + [curve[e]],
                                          metric)
            entry['speedup'][str(e)] = fits.effective_speedup_interval(
                dict(zip(baseline_epochs, cells[:-1])), cells[-1], e, paired=paired)
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
                               baseline_of[label], label == baseline_of[label], metric)
                for label, curve in usable.items()}
    return dict(metric=metric, baseline=first, target=target, curves=analysis,
                skipped={label: len(curve) for label, curve in curves.items()
                         if label not in usable})
