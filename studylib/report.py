"""A study's outputs, rebuilt from its records: summary.json (the configurations, comparisons,
speedups and variance, from the records and the saved logits, streamed, each analysis alone),
report.md, runs.csv and the plots. An analysis that cannot be made says why in its place; only a
study directory that cannot be read stops the report."""
import json
import math

from . import analysis, looks
from .errors import StudyError
from .files import StudyDir, atomic_write, read_compiles
from .markdown import report_lines
from .plots import plot
from .tables import ensemble_tallies, failed_runs, load_study, read_study, test_labels


def json_safe(value):
    """JSON without NaN or Infinity: a float that is not finite becomes null (its analysis says
    why in a reason field)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: json_safe(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(item) for item in value]
    return value


def write_outputs(study_dir, target=None, resolve=None, require_speedup=False,
                  require_variance=False, margin=None, time_margin=None):
    """Write summary.json, runs.csv, report.md and the plots. Raises StudyError only for a study
    directory that cannot be read, or an analysis that require_* asks for and that is absent
    (after writing everything else)."""
    summary, runs = summarize(study_dir, target, resolve, margin, time_margin)
    summary = json_safe(summary)
    looks.record_look(study_dir, summary, target)
    files = StudyDir(study_dir)
    atomic_write(files.summary(), json.dumps(summary, indent=2))
    atomic_write(files.runs_csv(), runs.to_csv(index=False))
    try:
        plot(study_dir, summary, runs)
    except Exception as error:  # noqa: BLE001: a plot that fails never costs the report
        summary['plots_reason'] = f'the plots failed ({type(error).__name__}: {error})'
    lines = report_lines(summary)
    if 'plots_reason' in summary:
        lines += ['', f"Plots: {summary['plots_reason']}."]
    atomic_write(files.report(), '\n'.join(lines) + '\n')
    for name, wanted in (('speedup', require_speedup), ('variance', require_variance)):
        section = summary[name]
        if wanted and isinstance(section, dict) and set(section) == {'reason'}:
            raise StudyError(f"no {name} analysis: {section['reason']}")
    return summary


def write_report(study_dir, resolve=None):
    """The summary, report and plots at the end of a launch; None, or what went wrong and how to
    rebuild them (the runs are written whatever the analyses raise)."""
    try:
        write_outputs(study_dir, resolve=resolve)
    except Exception as error:  # noqa: BLE001: whatever the analyses raise, the runs are kept
        return report_failure(study_dir, error)
    return None


def report_failure(study_dir, error):
    message = (str(error).splitlines() or [''])[0][:300]
    return (f'the report of {study_dir} could not be written ({type(error).__name__}: {message}); '
            f'the runs are kept: rebuild it with python study.py report {study_dir}')


def summarize(study_dir, target=None, resolve=None, margin=None, time_margin=None):
    """summary.json's content and the table of runs it was computed from. target: the accuracy
    target (default: the study's); resolve: a difference in points of accuracy, fixed in advance,
    for which every comparison gets the runs needed to detect it; margin (points of accuracy) and
    time_margin (a ratio of times): the equivalence margins of the comparisons."""
    study = read_study(study_dir)
    given = target
    target = target if target is not None else study.target
    settings = study.settings
    runs, _ = load_study(study_dir, outputs=False)
    failed = failed_runs(study_dir, study)
    configs = study.configs
    expected = len(configs) * study.runs
    overhead = analysis.section(analysis.between_runs, runs)
    summary = dict(
        status='complete' if len(runs) == expected else 'partial', runs_requested=study.runs,
        runs_finished=len(runs), runs_failed=sum(map(len, failed.values())),
        runs_diverged=int(runs['diverged'].fillna(False).astype(bool).sum())
        if 'diverged' in runs else 0,
        damaged=runs.attrs.get('damaged', []),
        seed=settings['seed'], vary=settings['vary'], target=target,
        accuracy_on='validation' if settings['val_split'] else 'test',
        configs=analysis.config_summaries(runs, configs, failed),
        target_claims=analysis.section(analysis.target_claims, runs, configs, target),
        comparisons=analysis.section(analysis.comparisons, runs, configs, resolve, margin,
                                     time_margin),
        speedup=analysis.section(analysis.speedup_analysis, runs, configs, target),
        variance=analysis.section(variance_analysis, study_dir, runs, settings),
        launches=[dict(id=launch['id'], started=launch['started'],
                       environment=launch['environment'],
                       between_runs=overhead.get(launch['id']),
                       compiles=analysis.section(analysis.compile_costs,
                                                 read_compiles(study_dir, launch['id'])))
                  for launch in study.launches])
    summary['looks'] = analysis.section(looks.looks_analysis, study, runs, summary, given,
                                        looks.read_looks(study_dir))
    return summary, runs


def variance_analysis(study_dir, runs, settings):
    """Per configuration with 2 or more runs of saved logits, with TTA and without, the variance
    table's entry (EnsembleTally.summary), or {'reason': ...}."""
    labels = test_labels(study_dir)
    if not settings.get('save_logits') or labels is None:
        return {'reason': 'the study needs saved logits (--save-logits, from its first launch)'}
    tallies = ensemble_tallies(study_dir, runs, labels, len(settings['data']['classes']))
    found = {config: {name: analysis.section(tally.summary) for name, tally in pair.items()}
             for config, pair in tallies.items() if pair['tta'].runs >= 2}
    return found or {'reason': 'no configuration has 2 or more finished runs with saved logits'}
