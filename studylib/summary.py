"""summary.json's numbers: a study's configurations, comparisons, speedups and variance, computed
from its records (load_study) and its saved logits (streamed), each analysis alone."""
from . import analysis, looks
from .load import ensemble_tallies, failed_runs, load_study, read_study, test_labels


def summarize(study_dir, target=None, resolve=None, margin=None, time_margin=None):
    """summary.json's content and the table of runs it was computed from. target: the accuracy
    target (default: the study's); resolve: a difference in points of accuracy, fixed in advance,
    for which every comparison gets the runs needed to detect it; margin (points of accuracy) and
    time_margin (a ratio of times): the equivalence margins of the comparisons."""
    study = read_study(study_dir)
    given, target = target, target if target is not None else study.target
    settings = study.settings
    runs, _ = load_study(study_dir, outputs=False)
    failed = failed_runs(study_dir, study)
    configs = study.configs
    expected = len(configs) * study.runs
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
                       environment=launch['environment']) for launch in study.launches])
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
