"""report.md from summary.json's numbers: one table per analysis, every statistic named for what
it is, every interval not known to cover marked and explained, and one line for each analysis
that could not be made."""
DAGGER = '†'


def fmt(value, digits=4):
    return '' if value is None else f'{value:.{digits}f}'


def fmt_interval(low, high, digits=4):
    """[low, high], with an open bound shown as such."""
    if low is None and high is None:
        return ''
    return f"[{fmt(low, digits) if low is not None else 'open'}, " \
           f"{fmt(high, digits) if high is not None else 'open'}]"


def missing(section):
    """The reason an analysis is absent, or None when it is there."""
    return section.get('reason') if isinstance(section, dict) and set(section) == {'reason'} \
        else None


class Notes:
    """Footnotes for the intervals that are not reliable: each reason once, numbered."""

    def __init__(self):
        self.reasons = []

    def mark(self, result):
        """'' for a reliable result; else a dagger and the number of its reason."""
        if result is None or result.get('reliable', True):
            return ''
        reason = result.get('reason') or 'coverage not measured here'
        if reason not in self.reasons:
            self.reasons.append(reason)
        return f' {DAGGER}{self.reasons.index(reason) + 1}'

    def lines(self):
        return [f'{DAGGER}{index + 1}: {reason}.' for index, reason in enumerate(self.reasons)]


def interval_cell(result, notes, digits=3, scale=1.0):
    """'estimate [low, high]' of an interval result of studylib.fits, marked when not reliable."""
    if result is None:
        return ''
    if result['estimate'] is None:
        return 'undefined' + notes.mark(dict(result, reliable=False))
    scaled = [None if v is None else scale * v for v in
              (result['estimate'], result['ci_low'], result['ci_high'])]
    return f'{fmt(scaled[0], digits)} {fmt_interval(scaled[1], scaled[2], digits)}' \
           + notes.mark(result)


def config_table(summary):
    target = summary['target']
    lines = ['| configuration | TTA | n | diverged | failed | mean | std | 95% CI of the mean | '
             + (f'p of "mean <= {target}" | above {target} at 5% | ' if target is not None else '')
             + 'timed seconds: mean [95% CI] (device, n) |',
             '|---|---|---|---|---|---|---|---|' + ('---|---|' if target is not None else '')
             + '---|']
    for name, c in summary['configs'].items():
        if missing(c):
            lines.append(f'| {name} | not computed: {missing(c)} |')
            continue
        times = '; '.join(f"{fmt(t['mean'], 2)} {fmt_interval(t['ci_low'], t['ci_high'], 2)} "
                          f"({model}, {t['n']})" for model, t in c['time_by_device'].items())
        row = (f"| {name} | {c['tta']['name']} | {c['n']} | {c['diverged'] or ''} | "
               f"{c['failed'] or ''} | {fmt(c['mean'])} | {fmt(c['std'])} | "
               f"{fmt_interval(c['ci_low'], c['ci_high'])} | ")
        if target is not None:
            decision = {None: '', True: 'yes', False: 'no'}[c['above_target_at_5pct']]
            row += f"{fmt(c['p_mean_at_most_target'], 3)} | {decision} | "
        lines.append(row + f'{times} |')
    return lines


def failure_lines(summary):
    """The failed and diverged runs: they are not in the statistics."""
    lines = []
    for name, c in summary['configs'].items():
        if missing(c):
            continue
        if c['failed']:
            lines.append(f"- {name}: {c['failed']} failed ({'; '.join(c['failures'])}); the same "
                         'command retries them; their errors are in runs/CONFIG/RUN.failed.json')
        if c['diverged']:
            lines.append(f"- {name}: {c['diverged']} diverged (a loss not finite), left out of "
                         'the mean and every analysis')
    return ['Runs left out of the statistics:', '', *lines, ''] if lines else []


def comparison_lines(section, digits=4):
    if missing(section):
        return [f'Not computed: {missing(section)}.']
    resolve = section['resolve']
    lines = [f"Each configuration against its baseline; family for Holm's adjustment: "
             f"{section['family']}. The test is the one the design calls for: paired over runs "
             "with the same seeds (study.py gives run i of every configuration the same seeds), "
             "Welch's otherwise; summary.json holds the other. Effect size: Cohen's d_av (the "
             'difference over the root mean of the two variances). Runs for 80% power: per '
             'configuration, at the observed std (and correlation), to detect the observed '
             'difference' + (f' and a difference of {resolve:g} points (--resolve)' if resolve else '')
             + ' with a two-sided test at 5%.', '',
             '| configuration | against | test | difference of means | 95% CI | p | p (Holm) | '
             'effect size | correlation within pairs | runs for 80% power'
             + (f' | runs to resolve {resolve:g} points' if resolve else '') + ' |',
             '|---|---|---|---|---|---|---|---|---|---|' + ('---|' if resolve else '')]
    for c in section['comparisons']:
        if c.get('reason') and c.get('difference') is None:
            lines.append(f"| {c['config']} | {c['baseline']} | not computed: {c['reason']} |")
            continue
        interval = fmt_interval(c['ci_low'], c['ci_high'], digits) if c['p_value'] is not None \
            else f"not tested: {c.get('reason') or 'undefined'}"
        lines.append(
            f"| {c['config']} | {c['baseline']} | {c['test']} | {fmt(c['difference'], digits)} | "
            f"{interval} | {fmt(c['p_value'], 3)} | "
            f"{fmt(c['p_holm'], 3)} | {fmt(c['effect_size'], 2)} | "
            f"{fmt(c.get('correlation'), 2)} | {c['runs_to_resolve_difference'] or ''}"
            + (f" | {c.get('runs_to_resolve') or ''}" if resolve else '') + ' |')
    ratios = [(c['config'], c['baseline'], model, ratio) for c in section['comparisons']
              for model, ratio in (c.get('time_ratio_by_device') or {}).items()]
    if ratios:
        lines += ['', 'Timed seconds, configuration over baseline (the ratio of geometric means, '
                  "with Welch's interval on log seconds; per device model):", '',
                  '| configuration | against | device | time ratio [95% CI] |', '|---|---|---|---|']
        lines += [f"| {config} | {baseline} | {model} | {fmt(r['ratio'], 3)} "
                  f"{fmt_interval(r['ci_low'], r['ci_high'], 3)} |"
                  for config, baseline, model, r in ratios]
    return lines


def speedup_lines(section):
    if missing(section):
        return [f'Not computed: {missing(section)}.']
    notes = Notes()
    lines = [f"Power law error = c + b * epochs^a fitted to each curve's mean errors "
             f"({section['metric']}); epochs to the target {section['target']}; effective "
             f"speedup over {section['baseline']}: the epochs its fit needs for the same error, "
             'divided by the epochs, minus 1. 95% intervals: the fit redone on cell means drawn '
             'from their Student-t distributions (studylib.fits); an interval whose coverage '
             f'was not measured in its conditions is marked {DAGGER}.', '',
             '| curve | epochs | n | mean accuracy [95% CI] | the fit\'s accuracy | fit (a, b, c) | '
             'epochs to target [95% CI] | effective speedup [95% CI] |',
             '|---|---|---|---|---|---|---|---|']
    for label, curve in section['curves'].items():
        if missing(curve):
            lines.append(f'| {label} | not computed: {missing(curve)} |')
            continue
        fit = curve['fit']
        shown_fit = '{a:.3f}, {b:.4f}, {c:.4f}'.format(**fit) if fit else \
            'none' + notes.mark(dict(reliable=False, reason=curve.get('fit_reason')))
        to_target = interval_cell(curve['epochs_to_target'], notes, 2)
        for index, epochs in enumerate(curve['epochs']):
            first = index == 0
            speed = interval_cell(curve['speedup'].get(str(epochs)), notes)
            fitted = fmt(curve['fitted_accuracy'][index]) if curve['fitted_accuracy'] else ''
            lines.append(
                f"| {label if first else ''} | {epochs:g} | {curve['n'][index]} | "
                f"{fmt(curve['mean_accuracy'][index])} "
                f"{fmt_interval(curve['ci_low'][index], curve['ci_high'][index])} | {fitted} | "
                f"{shown_fit if first else ''} | {to_target if first else ''} | {speed} |")
    skipped = ', '.join(f'{label} ({count} epoch counts)'
                        for label, count in section.get('skipped', {}).items())
    return lines + [''] * bool(notes.reasons) + notes.lines() + \
        ([f'Curves with fewer than 3 epoch counts, not fitted: {skipped}.'] if skipped else [])


def variance_lines(section):
    if missing(section):
        return [f'Not computed: {missing(section)}.']
    notes = Notes()
    lines = ['| configuration | TTA | n | mean accuracy | test-set std [95% CI] | '
             'distribution-wise std [95% CI] | CACE [95% CI] | CACE if calibrated |',
             '|---|---|---|---|---|---|---|---|']
    for config, entries in section.items():
        for key, e in entries.items():
            tta = 'yes' if key == 'tta' else 'no'
            if missing(e):
                lines.append(f'| {config} | {tta} | not computed: {missing(e)} |')
                continue
            calibration = e['calibration']
            dist = fmt(e['distribution_wise_std']) if e['distribution_wise_std'] is not None \
                else 'below 0' + notes.mark(dict(reliable=False,
                                                 reason=e['distribution_wise_note']))
            lines.append(
                f"| {config} | {tta} | {e['n']} | {fmt(e['mean'])} | {fmt(e['test_set_std'])} "
                f"{fmt_interval(*e['test_set_std_ci'])} | {dist} "
                f"{fmt_interval(*e['distribution_wise_std_ci'])} | "
                f"{fmt(calibration['estimate'])} "
                f"{fmt_interval(calibration['ci_low'], calibration['ci_high'])} | "
                f"{fmt(calibration['calibrated_level'])} (up to "
                f"{fmt(calibration['calibrated_upper'])}) |")
    return lines + ['', 'Test-set std: between runs, with the chi-square interval. '
                    'Distribution-wise std: the part of it that is not the sampling of the test '
                    'set (Jordan 2024, Theorem 2), with the same interval less that sampling term. '
                    'CACE: class-aggregated calibration error of the ensemble of runs (Jiang et al. '
                    '2022) in 15 equal-mass bins, with the basic bootstrap interval over test '
                    'examples; "if calibrated": the mean (and 97.5th percentile) of the same '
                    "figure for labels drawn from the ensemble's own vote shares, the floor of a "
                    'test set this size.'] + notes.lines()


def damaged_lines(summary):
    """The damaged files the report leaves out: their runs are not finished."""
    if not summary.get('damaged'):
        return []
    return ['Damaged files, not counted (the next launch sets each aside in set_aside/, kept, and '
            'trains its run again with the same seeds):', '',
            *(f'- {line}' for line in summary['damaged']), '']


def report_lines(summary):
    target = summary['target']
    lines = [f"# Study: {summary['accuracy_on']} accuracy", '',
             f"{summary['runs_finished']} of {len(summary['configs']) * summary['runs_requested']} "
             f"runs finished ({summary['status']}); {summary['runs_failed']} failed, "
             f"{summary['runs_diverged']} diverged; seeds from {summary['seed']}, varying "
             f"{summary['vary']}.", '', *damaged_lines(summary), '## Configurations', '',
             *config_table(summary), '',
             *failure_lines(summary),
             'TTA: what each configuration\'s accuracy is measured with (its net.tta_level). std: '
             "between runs. 95% CI: of the mean (Student's t). Timed seconds per device model, "
             'never averaged across models.']
    if target is not None:
        lines.append(f'Target {target}: the p-value of the one-sided t-test of "mean <= {target}": '
                     'small when the mean exceeds the target.')
    lines += ['', '## Comparisons', '', *comparison_lines(summary['comparisons']),
              '', '## Epochs to target and effective speedup', '',
              *speedup_lines(summary['speedup'])]
    if not missing(summary['speedup']):
        lines += ['', '![epochs](epochs.png)']
    lines += ['', '## Variance and calibration', '', *variance_lines(summary['variance']),
              '', '## Launches', '']
    for launch in summary['launches']:
        environment = ', '.join(f'{k} {v}' for k, v in launch['environment'].items()
                                if v not in (None, 0, {}))
        lines.append(f"- {launch['started']} ({launch['id']}): {environment}")
    return lines + ['', '![accuracy](accuracy.png) ![time](time.png)']
