"""report.md from summary.json's numbers: one table per analysis, every statistic named for what
it is, every interval not known to cover marked and explained, and one line for each analysis
that could not be made."""
DAGGER = '†'


def fmt(value, digits=4):
    return '' if value is None else f'{value:.{digits}f}'


def fmt_interval(low, high, digits=4):
    if low is None and high is None:
        return ''
    return f"[{fmt(low, digits) if low is not None else 'open'}, " \
           f"{fmt(high, digits) if high is not None else 'open'}]"


def missing(section):
    return section.get('reason') if isinstance(section, dict) and set(section) == {'reason'} \
        else None


class Notes:
    """Footnotes for the intervals that are not reliable: each reason once, numbered."""

    def __init__(self):
        self.reasons = []

    def mark(self, result):
        if result is None or result.get('reliable', True):
            return ''
        reason = result.get('reason') or 'coverage not measured here'
        if reason not in self.reasons:
            self.reasons.append(reason)
        return f' {DAGGER}{self.reasons.index(reason) + 1}'

    def lines(self):
        return [f'{DAGGER}{index + 1}: {reason}.' for index, reason in enumerate(self.reasons)]


def interval_cell(result, notes, digits=3, scale=1.0):
    """'estimate [low, high]' of a studylib.stats.fits interval, marked when not reliable."""
    if result is None:
        return ''
    if result['estimate'] is None:
        return 'undefined' + notes.mark(dict(result, reliable=False))
    scaled = [None if v is None else scale * v for v in
              (result['estimate'], result['ci_low'], result['ci_high'])]
    return f'{fmt(scaled[0], digits)} {fmt_interval(scaled[1], scaled[2], digits)}' \
           + notes.mark(result)


def config_table(summary):
    lines = ['| configuration | TTA | n | diverged | failed | mean | std | 95% CI of the mean | '
             'timed seconds: mean [95% CI] (device, n) |',
             '|---|---|---|---|---|---|---|---|---|']
    for name, c in summary['configs'].items():
        if missing(c):
            lines.append(f'| {name} | not computed: {missing(c)} |')
            continue
        times = '; '.join(f"{fmt(t['mean'], 2)} {fmt_interval(t['ci_low'], t['ci_high'], 2)} "
                          f"({model}, {t['n']})" for model, t in c['time_by_device'].items())
        lines.append(f"| {name} | {c['tta']['name']} | {c['n']} | {c['diverged'] or ''} | "
                     f"{c['failed'] or ''} | {fmt(c['mean'])} | {fmt(c['std'])} | "
                     f"{fmt_interval(c['ci_low'], c['ci_high'])} | {times} |")
    return lines


def verdict(value, exploratory):
    """yes / no / '' of a claim, marked when the claim is exploratory (summary['looks'])."""
    shown = {None: '', True: 'yes', False: 'no'}[value]
    return f'{shown} (exploratory)' if shown and exploratory else shown


def target_lines(section, looks=None):
    """The record claims: per configuration, every run counted (diverged ones at the accuracy
    they ended with), the one-sided bound that matches the one-sided test, and Holm's verdict."""
    if missing(section):
        return [f'Not computed: {missing(section)}.']
    target = section['target']
    exploratory = bool(looks and looks.get('exploratory'))
    confidence = next((c['confidence'] for c in section['claims'].values() if 'confidence' in c),
                      0.95)
    lines = [f'The claim "the mean accuracy exceeds {target}", one per configuration, counting '
             'every trained run: a diverged run enters at the accuracy it ended with (a record '
             'counts every run it trained), and the divergence rate is given with its exact '
             '(Clopper-Pearson) 95% interval. The test is one-sided, and so is its bound: the '
             f'{confidence:.0%} lower bound of the mean exceeds the target exactly when p < '
             f"{1 - confidence:.2g}. The verdict is Holm's over the family of {section['family']}"
             ': a bound above the target with a verdict of "no" is the family\'s adjustment.', '',
             f'| configuration | runs (diverged) | divergence rate [95% CI] | mean of every run | '
             f'{confidence:.0%} lower bound (one-sided) | p of "mean <= {target}" | p (Holm) | '
             f'above {target} |', '|---|---|---|---|---|---|---|---|']
    for name, c in section['claims'].items():
        if missing(c):
            lines.append(f'| {name} | not computed: {missing(c)} |')
            continue
        rate = '' if c['divergence_rate'] is None else \
            f"{fmt(c['divergence_rate'], 3)} {fmt_interval(*c['divergence_ci'], 3)}"
        decision = verdict(c.get('above_target'), exploratory) if c['p_value'] is not None \
            else f"not tested: {c['reason']}"
        lines.append(f"| {name} | {c['n']} ({c['diverged']}) | {rate} | {fmt(c['mean'])} | "
                     f"{fmt(c['lower_bound'])} | {fmt(c['p_value'], 3)} | "
                     f"{fmt(c.get('p_holm'), 3)} | {decision} |")
    return lines


def failure_lines(summary):
    """The failed and diverged runs, which the description leaves out."""
    lines = []
    for name, c in summary['configs'].items():
        if missing(c):
            continue
        if c['failed']:
            lines.append(f"- {name}: {c['failed']} failed ({'; '.join(c['failures'])}); the same "
                         'command retries them; their errors are in runs/CONFIG/RUN.failed.json')
        if c['diverged']:
            lines.append(f"- {name}: {c['diverged']} diverged (a loss not finite), left out of "
                         'the mean, the comparisons and the curves; the target claims count them '
                         'at the accuracy they ended with')
    return ['Runs left out of the description:', '', *lines, ''] if lines else []


def comparison_lines(section, digits=4, looks=None):
    if missing(section):
        return [f'Not computed: {missing(section)}.']
    resolve = section['resolve']
    margin = section.get('margin')
    exploratory = bool(looks and looks.get('exploratory'))
    lines = [f"Each configuration against its baseline; family for Holm's adjustment: "
             f"{section['family']}. The test is the one the design calls for: paired over runs "
             "with the same seeds (study.py gives run i of every configuration the same seeds), "
             "Welch's otherwise; summary.json holds the other. Effect size: Cohen's d_av (the "
             'difference over the root mean of the two variances). A p-value above 0.05 is no '
             'evidence of "the same accuracy": only the equivalence test within a margin fixed '
             'in advance (`study.py report --margin POINTS`) is.'
             + (f' Runs to resolve {resolve:g} points (--resolve, a difference fixed in advance): '
                'per configuration, at the observed std (and correlation), for 80% power with a '
                'two-sided test at 5%.' if resolve else ''), '',
             '| configuration | against | test | difference of means | 95% CI | p | p (Holm) | '
             'effect size | correlation within pairs'
             + (f' | runs to resolve {resolve:g} points' if resolve else '') + ' |',
             '|---|---|---|---|---|---|---|---|---|' + ('---|' if resolve else '')]
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
            f"{fmt(c.get('correlation'), 2)}"
            + (f" | {c.get('runs_to_resolve') or ''}" if resolve else '') + ' |')
    if margin is not None:
        lines += ['', *equivalence_table(
            f'Equivalence of accuracy within ±{margin:g} points (--margin): the two one-sided '
            f"tests (TOST), paired or Welch's as above, with the 90% interval of the difference "
            f"in points; family for Holm's adjustment: {section['equivalence_family']}.",
            [(c['config'], c['baseline'], '', c['equivalence']) for c in section['comparisons']
             if c.get('equivalence')], 100, 3, exploratory)]
    ratios = [(c['config'], c['baseline'], model, ratio) for c in section['comparisons']
              for model, ratio in (c.get('time_ratio_by_device') or {}).items()]
    if ratios:
        lines += ['', 'Timed seconds, configuration over baseline (the ratio of geometric means, '
                  "with Welch's interval on log seconds; per device model):", '',
                  '| configuration | against | device | time ratio [95% CI] |', '|---|---|---|---|']
        lines += [f"| {config} | {baseline} | {model} | {fmt(r['ratio'], 3)} "
                  f"{fmt_interval(r['ci_low'], r['ci_high'], 3)} |"
                  for config, baseline, model, r in ratios]
    times = [(c['config'], c['baseline'], model, test) for c in section['comparisons']
             for model, test in (c.get('time_equivalence_by_device') or {}).items()]
    if section.get('time_margin') is not None and times:
        low, high = times[0][3]['equivalence_range']
        lines += ['', *equivalence_table(
            f"As fast as, within a ratio of {section['time_margin']:g} (--time-margin: "
            f'[{low:.3f}, {high:.3f}]): the TOST of the ratio of geometric-mean seconds, Welch\'s '
            'on log seconds, per device model, with its 90% interval; in the same Holm family.',
            times, 1, 3, exploratory)]
    return lines


def equivalence_table(caption, rows, scale, digits, exploratory):
    """The equivalence tests' table: rows of (configuration, baseline, device, TOST result)."""
    lines = [caption, '', '| configuration | against | device | difference | 90% CI | '
             'p (TOST) | p (Holm) | equivalent |', '|---|---|---|---|---|---|---|---|']
    for config, baseline, model, test in rows:
        if test['p_value'] is None:
            lines.append(f"| {config} | {baseline} | {model} | not tested: {test['reason']} |")
            continue
        low, high = (None if v is None else scale * v for v in (test['ci_low'], test['ci_high']))
        lines.append(f"| {config} | {baseline} | {model} | "
                     f"{fmt(scale * test['difference'], digits)} | "
                     f"{fmt_interval(low, high, digits)} | {fmt(test['p_value'], 3)} | "
                     f"{fmt(test.get('p_holm'), 3)} | "
                     f"{verdict(test['equivalent'], exploratory)} |")
    return lines


def speedup_lines(section):
    if missing(section):
        return [f'Not computed: {missing(section)}.']
    notes = Notes()
    lines = [f"Power law error = c + b * epochs^a fitted to each curve's mean errors "
             f"({section['metric']}); epochs to the target {section['target']}; effective "
             f"speedup over {section['baseline']}: the epochs its fit needs for the same error, "
             'divided by the epochs, minus 1. 95% intervals: the fit redone on cell means drawn '
             'jointly, with the variance pooled across cells and, where runs share their seeds, '
             'a run effect shared by the cells (studylib.stats.fits). Lack of fit: the F test of '
             "the law against the runs' spread, with 4 or more epoch counts; a law it rejects at "
             '5% marks what is derived from it. An interval whose coverage was not measured in its '
             f'conditions is marked {DAGGER}.', '',
             '| curve | epochs | n | mean accuracy [95% CI] | the fit\'s accuracy | fit (a, b, c) | '
             'lack of fit: F (p) | epochs to target [95% CI] | effective speedup [95% CI] |',
             '|---|---|---|---|---|---|---|---|---|']
    for label, curve in section['curves'].items():
        if missing(curve):
            lines.append(f'| {label} | not computed: {missing(curve)} |')
            continue
        fit = curve['fit']
        shown_fit = '{a:.3f}, {b:.4f}, {c:.4f}'.format(**fit) if fit else \
            'none' + notes.mark(dict(reliable=False, reason=curve.get('fit_reason')))
        to_target = interval_cell(curve['epochs_to_target'], notes, 2)
        misfit = lack_of_fit_cell(curve.get('lack_of_fit'), notes)
        for index, epochs in enumerate(curve['epochs']):
            first = index == 0
            speed = interval_cell(curve['speedup'].get(str(epochs)), notes)
            fitted = fmt(curve['fitted_accuracy'][index]) if curve['fitted_accuracy'] else ''
            lines.append(
                f"| {label if first else ''} | {epochs:g} | {curve['n'][index]} | "
                f"{fmt(curve['mean_accuracy'][index])} "
                f"{fmt_interval(curve['ci_low'][index], curve['ci_high'][index])} | {fitted} | "
                f"{shown_fit if first else ''} | {misfit if first else ''} | "
                f"{to_target if first else ''} | {speed} |")
    skipped = ', '.join(f'{label} ({count} epoch counts)'
                        for label, count in section.get('skipped', {}).items())
    return lines + [''] * bool(notes.reasons) + notes.lines() + \
        ([f'Curves with fewer than 3 epoch counts, not fitted: {skipped}.'] if skipped else [])


def lack_of_fit_cell(test, notes):
    """'F (p)' of a curve's lack-of-fit test, marked where it rejects the law at 5%."""
    if not test or test['p_value'] is None:
        return ''
    shown = f"{test['statistic']:.2f} ({test['p_value']:.2g})"
    if test['p_value'] < 0.05:
        shown += ' bad fit' + notes.mark(dict(reliable=False, reason=(
            'the power law does not fit: its misfit of the means is larger than the runs\' '
            'spread explains (lack-of-fit F test at 5%)')))
    return shown


def variance_lines(section):
    if missing(section):
        return [f'Not computed: {missing(section)}.']
    notes = Notes()
    lines = ['| configuration | TTA | n | mean accuracy | test-set std [95% CI] | '
             'distribution-wise std [95% CI] | CACE [95% CI] | CACE if calibrated | '
             'plug-in CACE | bins used |', '|---|---|---|---|---|---|---|---|---|---|']
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
            cace = fmt(calibration['estimate']) + notes.mark(dict(
                reliable=calibration.get('comparable', True), reason=calibration.get('note')))
            lines.append(
                f"| {config} | {tta} | {e['n']} | {fmt(e['mean'])} | {fmt(e['test_set_std'])} "
                f"{fmt_interval(*e['test_set_std_ci'])} | {dist} "
                f"{fmt_interval(*e['distribution_wise_std_ci'])} | {cace} "
                f"{fmt_interval(calibration['ci_low'], calibration['ci_high'])} | "
                f"{fmt(calibration['calibrated_level'])} (up to "
                f"{fmt(calibration['calibrated_upper'])}) | {fmt(calibration['plug_in'])} | "
                f"{'/'.join(map(str, calibration.get('bins_used') or []))} |")
    return lines + ['', 'Test-set std: between runs, with the chi-square interval, which assumes '
                    'runs spread normally (with a tail of bad runs it covers less: 85 to 92% in '
                    'docs/studies.md). Distribution-wise std: the part of it that is not the '
                    'sampling of the test set (Jordan 2024, Theorem 2), with the same interval '
                    'less that sampling term. CACE: class-aggregated calibration error (Jiang et '
                    'al. 2022) of the ensemble in the limit of many runs, estimated the same way '
                    'at any number of runs from 100: pairs binned by the vote shares of 50 runs '
                    'of one half of the runs (even or odd), in up to 15 bins of nearly equal mass '
                    '(bins used: per half), and scored against the other half\'s shares, both '
                    'ways round; interval: the estimate +- 1.96 bootstrap standard deviations '
                    'over test examples. "if calibrated": the mean (and 97.5th percentile) of '
                    "the figure for labels drawn from the scoring half's own vote shares, the "
                    'floor of a test set this size. Plug-in CACE: the definition applied to the '
                    'ensemble of these runs, which falls as runs are added (not comparable across '
                    'studies).'] + notes.lines()


def looks_lines(looks):
    if not looks or missing(looks):
        return [f'Looks at the data: not known ({missing(looks)}).', ''] if looks else []
    if not looks['exploratory']:
        lines = ['Claims: confirmatory (the target and the plan were fixed before the results '
                 'were seen, and every planned run is in).']
    else:
        lines = ['**Claims: exploratory**, marked so below: ' + '; '.join(looks['reasons'])
                 + '. ' + looks['rule']]
    return lines + [f'Note: {note}.' for note in looks['notes']] + ['']


def damaged_lines(summary):
    if not summary.get('damaged'):
        return []
    return ['Damaged files, not counted (the next launch sets each aside in set_aside/, kept, and '
            'trains its run again with the same seeds):', '',
            *(f'- {line}' for line in summary['damaged']), '']


def report_lines(summary):
    looks = summary.get('looks')
    lines = [f"# Study: {summary['accuracy_on']} accuracy", '',
             f"{summary['runs_finished']} of {len(summary['configs']) * summary['runs_requested']} "
             f"runs finished ({summary['status']}); {summary['runs_failed']} failed, "
             f"{summary['runs_diverged']} diverged; seeds from {summary['seed']}, varying "
             f"{summary['vary']}.", '', *damaged_lines(summary), *looks_lines(looks),
             '## Configurations', '',
             *config_table(summary), '',
             *failure_lines(summary),
             'TTA: what each configuration\'s accuracy is measured with (its net.tta_level). std: '
             "between runs. 95% CI: of the mean (Student's t). Timed seconds per device model, "
             'never averaged across models.']
    lines += ['', '## Target claims', '', *target_lines(summary['target_claims'], looks),
              '', '## Comparisons', '', *comparison_lines(summary['comparisons'], looks=looks),
              '', '## Epochs to target and effective speedup', '',
              *speedup_lines(summary['speedup'])]
    if not missing(summary['speedup']):
        lines += ['', '![epochs](epochs.png)']
    lines += ['', '## Variance and calibration', '', *variance_lines(summary['variance']),
              '', '## Launches', '']
    for launch in summary['launches']:
        environment = ', '.join(f'{k} {v}' for k, v in launch['environment'].items()
                                if v not in (None, 0, {}))
        between = launch.get('between_runs') or {}
        engine = (f"; between runs {between['gap_seconds']:.3f} s on average, "
                  f"{100 * between['fraction']:.2f}% of a run's {between['run_seconds']:.3g} s "
                  f"({between['gaps']} gaps)") if 'fraction' in between else ''
        lines.append(f"- {launch['started']} ({launch['id']}): {environment}{engine}")
        lines += compile_lines(launch.get('compiles'))
    return lines + ['', '![accuracy](accuracy.png) ![time](time.png)']


def compile_lines(costs):
    """A launch's compiling, per configuration and stage (analysis.compile_costs), as a table
    under its line; nothing for a launch that recorded none."""
    if not costs:
        return []
    if missing(costs):
        return [f"  - compiling: {costs['reason']}"]
    lines = ['', '  | configuration | stage | processes | seconds (mean, largest) | graphs | '
             'inductor: compiled, from its cache | each process |',
             '  |---|---|---|---|---|---|---|']
    for cost in costs:
        outcomes = ', '.join(f'{count} {outcome}' for outcome, count in cost['came_from'].items())
        lines.append(f"  | {cost['config']} | {cost['stage']} | {cost['processes']} | "
                     f"{cost['seconds_mean']:.1f}, {cost['seconds_max']:.1f} | {cost['graphs']} | "
                     f"{cost['compiled']}, {cost['from_cache']} | {outcomes} |")
    return lines + ['']
