"""A study's report from its records, on study directories written as study.py writes them
(make_study, add_run: other files' synthetic studies too); the power-law fits as reported."""
import json
import math
import os

import numpy as np
import pandas as pd
import pytest
import torch
from scipy import stats

from power_law_runs import EPOCHS, LAW, SHORT_ALTERNATING, SHORT_RANDOM, synthetic_runs
from test_study import argv, image_folder, study_main  # noqa: F401

import study  # noqa: E402
import studylib.report  # noqa: E402
from studylib import analysis, markdown, plots, tables  # noqa: E402
from studylib.config import Config  # noqa: E402
from studylib.errors import StudyError  # noqa: E402
from studylib.records import CompileRecord  # noqa: E402
from studylib.stats.fits import (effective_speedup_interval,  # noqa: E402
                                 epochs_to_accuracy_interval, fit_power_law)
from studylib.stats import variance  # noqa: E402

HYP = {'opt': {'train_epochs': 10.0, 'lr': 11.5}, 'aug': {'flip': 'alternating'},
       'net': {'tta_level': 2}}
SEEDS = ('init', 'order', 'aug')
# Nine runs about 94.05%: a record at a target of 0.94 (p = 0.024 over the nine)
NINE = [0.93947, 0.93986, 0.94011, 0.94037, 0.9405, 0.94063, 0.94082, 0.94121, 0.94153]


def config(base, grid=None, **net):
    hyp = json.loads(json.dumps(HYP))
    hyp['net'].update(net)
    for key, value in (grid or {}).items():
        group, name = key.split('.')
        hyp[group][name] = float(value) if name == 'train_epochs' else value
    return dict(script='airbench94', script_sha256='0' * 64, overrides=[], base=base,
                grid=grid or {}, hyp=hyp)


def make_study(study_dir, configs, runs, target=None, save_logits=False, classes=10):
    os.makedirs(study_dir, exist_ok=True)
    study_json = dict(
        settings=dict(seed=0, vary='all', train_subset=None, val_split=0, save_logits=save_logits,
                      precision='fp32', data=dict(dataset='folder', train_splits='train',
                                                  sha256='0', num_train=100, num_test=100,
                                                  classes=[str(k) for k in range(classes)])),
        configs=configs, runs=runs, commands=[['study.py']],
        launches=[dict(id='abc', started='2026-11-26T00:00:00', command=['study.py'],
                       environment=dict(world_size=1, hosts='here', torch=torch.__version__))])
    if target is not None:
        study_json['target'] = target
    with open(os.path.join(study_dir, 'study.json'), 'w') as f:
        json.dump(study_json, f)


def add_run(study_dir, config_name, run, accuracy, diverged=False, seed_offset=0,
            seconds=3.0, device='GPU A', val_acc=None, outputs=None):
    directory = os.path.join(study_dir, 'runs', config_name)
    os.makedirs(directory, exist_ok=True)
    record = dict(config=config_name, run=run, script='airbench94', seed=run,
                  seeds={s: 1000 * run + seed_offset + i for i, s in enumerate(SEEDS)},
                  vary='all', accuracy=accuracy, accuracy_on='test', test_acc=accuracy,
                  val_acc=val_acc, total_time_seconds=seconds, steps=10,
                  graphs_compiled_during_run=0, epoch_train_losses=[None if diverged else 1.0],
                  diverged=diverged, train_images=100, rank=0, host='here', device='cuda',
                  device_model=device, torch=torch.__version__, launch='abc',
                  finished='2026-11-26T00:00:01')
    with open(os.path.join(directory, f'{run:05d}.json'), 'w') as f:
        json.dump(record, f)
    if outputs is not None:
        torch.save(outputs, os.path.join(directory, f'{run:05d}.pt'))


def add_runs(study_dir, config_name, accuracies, first=0, **options):
    for run, accuracy in enumerate(accuracies, start=first):
        add_run(study_dir, config_name, run, accuracy, **options)


def add_failure(study_dir, config_name, run):
    directory = os.path.join(study_dir, 'runs', config_name)
    os.makedirs(directory, exist_ok=True)
    failure = dict(config=config_name, run=run, failed=True, error_type='RuntimeError',
                   error='CUDA out of memory', rank=0, host='here')
    with open(os.path.join(directory, f'{run:05d}.failed.json'), 'w') as f:
        json.dump(dict(config=config_name, run=run, failures=[failure]), f)


def read_summary(study_dir):
    """summary.json, refusing the non-JSON constants NaN and Infinity."""
    def refuse(constant):
        raise AssertionError(f'summary.json holds {constant}')
    with open(os.path.join(study_dir, 'summary.json')) as f:
        return json.load(f, parse_constant=refuse)


def report_of(study_dir):
    return open(os.path.join(study_dir, 'report.md')).read()


@pytest.fixture(autouse=True)
def no_plots(request, monkeypatch):
    """No plots (nine tenths of a report's time) but in the tests that keep them as figures."""
    if 'figures' not in request.fixturenames:
        monkeypatch.setattr(studylib.report, 'plot', lambda *args: None)


@pytest.fixture
def figures(monkeypatch):
    """{name: figure} of the plots drawn, kept instead of saved."""
    drawn = {}
    monkeypatch.setattr(plots, 'save', lambda figure, directory, name, plt:
                        drawn.setdefault(name, figure))
    return drawn


def test_a_launch_with_a_flat_curve_and_a_diverged_configuration_exits_0_with_its_report(
        study_main, image_folder, tmp_path):
    """A falling curve, a flat one and one whose runs all diverge, at 3 epoch counts, launched:
    exit 0 with every output written, and what cannot be computed says why."""
    study_dir = str(tmp_path / 'study')
    assert study_main(argv(study_dir, image_folder, '--target', '0.94', '--resolve', '0.1',
                           '--grid', 'opt.train_epochs=40,80,160', '--config', 'falling',
                           'curve.a=-0.75', 'curve.b=1.2728', 'curve.c=0.03', 'curve.noise=0.005',
                           '--config', 'flat', 'curve.b=0', 'curve.c=0.06', 'curve.noise=0.0005',
                           '--config', 'diverged', 'curve.diverges=True', runs=4),
                      plots=True) == 0
    for name in ('summary.json', 'report.md', 'runs.csv', 'accuracy.png', 'time.png',
                 'epochs.png'):
        assert os.path.getsize(os.path.join(study_dir, name)) > 0
    summary = read_summary(study_dir)
    diverged = summary['configs']['diverged,train_epochs=80']
    assert (diverged['n'], diverged['diverged'], diverged['mean']) == (0, 4, None)
    assert summary['runs_diverged'] == 12
    curves = summary['speedup']['curves']
    assert set(curves) == {'falling', 'flat'}  # the diverged one has no runs to fit
    flat = curves['flat']['epochs_to_target']
    assert flat['estimate'] is None and 'do not fall' in flat['reason']
    assert curves['falling']['epochs_to_target']['reliable']
    claim = summary['target_claims']['claims']['diverged,train_epochs=80']
    assert (claim['n'], claim['diverged'], claim['divergence_rate']) == (4, 4, 1.0)
    assert claim['mean'] < 0.5 and claim['above_target'] is None  # chance, counted
    assert summary['comparisons']['resolve'] == 0.1
    report = report_of(study_dir)
    assert '| diverged,train_epochs=40 | six views | 0 | 4 |' in report
    assert 'diverged (a loss not finite), left out of the mean' in report
    assert 'runs to resolve 0.1 points' in report and 'undefined' in report


def test_single_epoch_count_and_every_run_failed(tmp_path):
    study_dir = str(tmp_path / 'failed')
    make_study(study_dir, {'a': config('a'), 'b': config('b')}, 2, target=0.94, save_logits=True)
    with open(os.path.join(study_dir, 'test_labels.json'), 'w') as f:
        json.dump([0, 1, 2], f)  # a launch writes them before any run
    for name in ('a', 'b'):
        for run in range(2):
            add_failure(study_dir, name, run)
    summary = study.write_outputs(study_dir)
    assert summary['runs_finished'] == 0 and summary['runs_failed'] == 4
    assert summary['configs']['a']['failed'] == 2 and summary['configs']['a']['n'] == 0
    assert 'epoch counts' in summary['speedup']['reason']
    assert '2 or more finished runs' in summary['variance']['reason']
    assert 'Not computed: the study needs a grid of 3 or more epoch counts' in report_of(study_dir)


def test_an_analysis_asked_for_that_cannot_be_made_is_refused_after_the_report(tmp_path, capsys):
    """`study.py report DIR --speedup` (one epoch count) or `--variance` (no saved logits): exit 1
    saying why in one line, everything else written."""
    study_dir = str(tmp_path / 'study')
    make_study(study_dir, {'a': config('a')}, 2)
    add_runs(study_dir, 'a', [0.93, 0.94])
    for flag, error in (('--speedup', 'no speedup analysis: the study needs a grid of 3 or more '
                         'epoch counts'), ('--variance', 'no variance analysis: the study needs '
                                           'saved logits (--save-logits')):
        assert study.main(['report', study_dir, flag]) == 1
        (line,) = capsys.readouterr().err.splitlines()
        assert line.startswith(f'error: {error}')
        assert os.path.exists(os.path.join(study_dir, 'report.md'))
    with pytest.raises(StudyError):
        study.write_outputs(study_dir, require_speedup=True)


def test_comparisons_are_paired_by_design_holm_adjusted_planned_and_tested_for_equivalence(
        tmp_path):
    """Each test as the design (shared seeds: paired), Holm-adjusted per family, runs to resolve
    only a difference fixed in advance (never post-hoc power), time ratios per device model, the
    TOST of accuracy and time with margins; means, intervals and tests against scipy's."""
    study_dir = str(tmp_path / 'pairs')
    names = ('base', 'better', 'same', 'slower', 'unpaired')
    make_study(study_dir, {name: config(name) for name in names}, 8)
    rng = np.random.default_rng(1)
    for run in range(8):
        shared = rng.normal(0, 0.001)
        for name, mean, seconds in (('base', 0.94, 3.0), ('better', 0.942, 2.4),
                                    ('same', 0.94, 3.0), ('slower', 0.94, 3.6)):
            add_run(study_dir, name, run, mean + shared + rng.normal(0, 0.0005),
                    seconds=seconds + rng.normal(0, 0.02))
        add_run(study_dir, 'unpaired', run, 0.94 + rng.normal(0, 0.001), seed_offset=7,
                seconds=3.1, device='GPU B')
    summary = study.write_outputs(study_dir)
    comparison = summary['comparisons']['comparisons'][0]
    assert 'runs_to_resolve_difference' not in comparison and 'runs_to_resolve' not in comparison
    report = report_of(study_dir)
    assert 'runs for 80% power' not in report and 'observed difference' not in report
    summary = study.write_outputs(study_dir, resolve=0.1, margin=0.3, time_margin=1.05)
    runs, _ = study.load_study(study_dir, outputs=False)
    accuracy = {name: runs[runs['config'] == name]['accuracy'].to_numpy() for name in names}
    seconds = {name: runs[runs['config'] == name]['total_time_seconds'].to_numpy()
               for name in names}
    base = summary['configs']['base']
    half_width = stats.t.ppf(0.975, 7) * np.std(accuracy['base'], ddof=1) / math.sqrt(8)
    assert [base['n'], base['mean'], base['std'], base['ci_low'], base['ci_high']] == \
        pytest.approx([8, accuracy['base'].mean(), np.std(accuracy['base'], ddof=1),
                       accuracy['base'].mean() - half_width, accuracy['base'].mean() + half_width])
    assert base['time_by_device']['GPU A']['mean'] == pytest.approx(seconds['base'].mean())
    found = {c['config']: c for c in summary['comparisons']['comparisons']}
    better = found['better']
    assert better['test'] == 'paired t-test' and better['design'] == 'paired'
    assert better['p_value'] == pytest.approx(
        stats.ttest_rel(accuracy['better'], accuracy['base']).pvalue)
    assert better['other_test']['p_value'] == pytest.approx(
        stats.ttest_ind(accuracy['better'], accuracy['base'], equal_var=False).pvalue)
    assert found['unpaired']['test'] == "Welch's t-test" and found['unpaired']['other_test'] is None
    others = ('better', 'same', 'slower', 'unpaired')
    assert [found[name]['p_holm'] for name in others] == \
        pytest.approx(study.holm([found[name]['p_value'] for name in others]))
    assert 'the 4 comparisons of this study' in summary['comparisons']['family']
    assert better['runs_to_resolve'] == study.runs_needed(
        better['std'], 0.001, paired=True, correlation=better['correlation'])
    assert better['time_ratio_by_device']['GPU A']['ratio'] == pytest.approx(0.8, rel=0.01)
    assert found['unpaired']['time_ratio_by_device'] == {}  # other device: no ratio
    same = found['same']
    assert same['equivalence']['p_value'] == pytest.approx(study.equivalence_test(
        accuracy['base'], accuracy['same'], 0.003, paired=True)['p_value'])
    assert same['time_equivalence_by_device']['GPU A']['p_value'] == pytest.approx(
        study.equivalence_test(seconds['base'], seconds['same'], 1.05, ratio=True)['p_value'])
    assert same['time_equivalence_by_device']['GPU A']['equivalent'] is True
    assert found['slower']['time_equivalence_by_device']['GPU A']['equivalent'] is False
    tests = [test for name in others for test in (found[name]['equivalence'],
                                                  *found[name]['time_equivalence_by_device']
                                                  .values())]
    assert [t['p_holm'] for t in tests] == pytest.approx(study.holm([t['p_value'] for t in tests]))
    report = report_of(study_dir)
    assert "| better | base | paired t-test |" in report and 'runs to resolve 0.1 points' in report
    assert 'Equivalence of accuracy within ±0.3 points' in report
    assert 'As fast as, within a ratio of 1.05' in report
    assert study.main(['report', study_dir, '--time-margin', '0.95']) == 1


def test_a_grid_only_study_compares_each_point_with_the_first_labelled_by_its_hyp(tmp_path):
    """The grid's first point is the baseline; each configuration's TTA is named from its own hyp,
    and the title claims none when they differ."""
    study_dir = str(tmp_path / 'grid')
    configs = {'lr=10': config('baseline', {'opt.lr': '10'}, tta_level=0),
               'lr=11': config('baseline', {'opt.lr': '11'}, tta_level=2, tta_fraction=0.25),
               'lr=12': config('baseline', {'opt.lr': '12'})}
    make_study(study_dir, configs, 3)
    rng = np.random.default_rng(2)
    for name in configs:
        add_runs(study_dir, name, 0.94 + rng.normal(0, 0.001, 3))
    summary = study.write_outputs(study_dir)
    pairs = [(c['config'], c['baseline']) for c in summary['comparisons']['comparisons']]
    assert pairs == [('lr=11', 'lr=10'), ('lr=12', 'lr=10')]
    assert [summary['configs'][name]['tta']['name'] for name in configs] == [
        'none', 'six views on the least confident 25%', 'six views']
    report = report_of(study_dir)
    assert report.startswith('# Study: test accuracy\n') and 'with TTA' not in report.split('\n')[0]


def test_the_plots_mark_every_mean_diverged_runs_and_device_models(tmp_path, figures):
    """Accuracy: a row per configuration, a mean without an interval still drawn, a diverged run
    said beside its row; time: one legend entry per device model."""
    study_dir = str(tmp_path / 'marks')
    names = [f'{name},train_epochs=5,lr=10' for name in ('spread', 'same', 'one')]
    make_study(study_dir, {name: config(name.partition(',')[0], {'opt.train_epochs': '5',
                                                                 'opt.lr': '10'})
                           for name in names}, 3)
    add_runs(study_dir, names[0], [0.90, 0.91, 0.92], device='GPU B')
    add_runs(study_dir, names[1], [0.93] * 3)
    add_run(study_dir, names[0], 3, 0.1, diverged=True)
    add_run(study_dir, names[2], 0, 0.95)
    study.write_outputs(study_dir)
    axes = figures['accuracy.png'].axes[0]
    assert [label.get_text() for label in axes.get_yticklabels()] == names
    hollow = [c for c in axes.collections if c.get_label().startswith('mean, no interval')]
    assert sorted(map(tuple, np.concatenate([c.get_offsets() for c in hollow]))) == \
        [(0.93, 1.0), (0.95, 2.0)]
    assert [t.get_text() for t in axes.texts] == ['+1 diverged']
    assert axes.get_xlim()[0] > 0.85  # the diverged run at 0.1 does not set the scale
    legend = [t.get_text() for t in axes.get_legend().get_texts()]
    assert sorted(legend) == sorted(set(legend))  # one entry per kind of mark
    legend = figures['time.png'].axes[0].get_legend()
    assert sorted(text.get_text() for text in legend.get_texts()) == ['GPU A', 'GPU B']


def logits_of(predictions, classes):
    logits = torch.zeros(len(predictions), classes, dtype=torch.float16)
    logits[torch.arange(len(predictions)), torch.as_tensor(predictions)] = 1
    return logits


def test_variance_streamed_over_runs_equals_the_arrays_and_grows_run_by_run(tmp_path,
                                                                          monkeypatch):
    study_dir = str(tmp_path / 'variance')
    classes = 5
    examples = 100
    rng = np.random.default_rng(3)
    labels = rng.integers(0, classes, examples)
    make_study(study_dir, {'a': config('a')}, 8, save_logits=True, classes=classes)
    with open(os.path.join(study_dir, 'test_labels.json'), 'w') as f:
        json.dump(labels.tolist(), f)
    predictions = {key: np.where(rng.random((8, examples)) < 0.8, labels,
                                 rng.integers(0, classes, (8, examples)))
                   for key in ('logits', 'logits_plain')}

    def add(run):
        add_run(study_dir, 'a', run, float((predictions['logits'][run] == labels).mean()),
                outputs={key: logits_of(p[run], classes) for key, p in predictions.items()})
    for run in range(5):
        add(run)
    reads = []
    real_read = tables.read_outputs
    monkeypatch.setattr(tables, 'read_outputs', lambda *args: reads.append(args) or
                        real_read(*args))
    study.write_outputs(study_dir)
    assert len(reads) == 10  # 5 runs, 2 kinds of logits
    for run in range(5, 8):
        add(run)
    summary = study.write_outputs(study_dir)
    assert len(reads) == 16  # only the 3 new runs were read
    for key, name in (('logits', 'tta'), ('logits_plain', 'no_tta')):
        entry = summary['variance']['a'][name]
        correct = predictions[key] == labels
        assert entry['n'] == 8
        assert entry['distribution_wise_variance'] == pytest.approx(
            variance.distribution_wise_variance(correct), rel=1e-12)
        assert entry['calibration']['plug_in'] == pytest.approx(
            variance.class_aggregated_calibration_error(predictions[key], labels,
                                                        num_classes=classes), rel=1e-12)
    runs, arrays = study.load_study(study_dir)
    assert len(arrays['logits']) == 8
    assert arrays['logits'][('a', 3)].dtype == np.float16
    assert (arrays['logits'][('a', 3)].argmax(1) == predictions['logits'][3]).all()


def test_record_claims_count_diverged_runs_and_are_holm_adjusted(tmp_path):
    """Nine runs about 94.05% and one diverged at 10%: the claim counts it (p = 0.827, not the
    nine's 0.024) and shows the one-sided bound; the three claims are one Holm family."""
    study_dir = str(tmp_path / 'record')
    make_study(study_dir, {name: config(name) for name in ('record', 'steady', 'short')}, 10,
               target=0.94)
    steady = [accuracy + 0.001 for accuracy in NINE]
    add_runs(study_dir, 'record', NINE)
    add_runs(study_dir, 'steady', steady)
    add_runs(study_dir, 'short', [accuracy - 0.002 for accuracy in NINE])
    add_run(study_dir, 'record', 9, 0.10, diverged=True)
    summary = study.write_outputs(study_dir)
    claims = summary['target_claims']['claims']
    record = claims['record']
    assert record['p_value'] == pytest.approx(0.826914, abs=1e-6)
    assert (record['n'], record['diverged'], record['above_target']) == (10, 1, False)
    assert record['lower_bound'] < 0.94
    p_values = [claims[name]['p_value'] for name in ('record', 'steady', 'short')]
    assert [claims[name]['p_holm'] for name in ('record', 'steady', 'short')] == \
        pytest.approx(study.holm(p_values))
    assert claims['steady']['above_target'] is True and claims['steady']['lower_bound'] > 0.94
    assert 'the 3 target claims' in summary['target_claims']['family']
    report = report_of(study_dir)
    assert '| record | 10 (1) | 0.100 [0.003, 0.445] |' in report
    assert '95% lower bound (one-sided)' in report
    assert 'above 0.94 at 5%' not in report  # the old verdict beside the two-sided interval


def rewrite_study(study_dir, **changes):
    path = os.path.join(study_dir, 'study.json')
    with open(path) as f:
        content = json.load(f)
    content.update(changes)
    with open(path, 'w') as f:
        json.dump(content, f)


def test_a_target_chosen_after_the_runs_makes_the_claims_exploratory(tmp_path):
    """`study.py report DIR --target T` after the runs: exploratory, said why and marked; the
    target set at the launch, before any run, gives confirmatory claims."""
    study_dir = str(tmp_path / 'retarget')
    make_study(study_dir, {'a': config('a')}, 9, target=0.94)
    add_runs(study_dir, 'a', NINE)
    summary = study.write_outputs(study_dir)
    assert summary['looks']['exploratory'] is False
    report = report_of(study_dir)
    assert 'Claims: confirmatory' in report and '| yes |' in report
    summary = study.write_outputs(study_dir, target=0.9395)
    assert summary['looks']['exploratory'] is True
    assert 'the target 0.9395 was given to `study.py report` after 9 runs' in \
        summary['looks']['reasons'][0]
    report = report_of(study_dir)
    assert '**Claims: exploratory**' in report and 'yes (exploratory)' in report
    assert 'fixed-n design' in report and 'alpha by a bound fixed in advance' in report
    with open(os.path.join(study_dir, 'analysis', 'looks.json')) as f:
        looks = json.load(f)['looks']
    assert [look['target'] for look in looks] == [0.94, 0.9395]
    assert [look['target_given'] for look in looks] == [None, 0.9395]


def test_runs_added_after_a_report_make_the_claims_exploratory(tmp_path):
    """Runs beyond the plan after a report: exploratory, naming that report; runs within the
    plan after an interim look are only noted."""
    study_dir = str(tmp_path / 'extended')
    make_study(study_dir, {'a': config('a')}, 4, target=0.94)
    add_runs(study_dir, 'a', NINE[:2])
    interim = study.write_outputs(study_dir)
    assert interim['looks']['exploratory'] and 'interim look' in interim['looks']['reasons'][0]
    add_runs(study_dir, 'a', NINE[2:4], first=2)
    complete = study.write_outputs(study_dir)
    assert not complete['looks']['exploratory']
    assert 'the runs added since were planned before it' in complete['looks']['notes'][0]
    rewrite_study(study_dir, runs=8)
    add_runs(study_dir, 'a', NINE[4:8], first=4)
    extended = study.write_outputs(study_dir)
    assert extended['looks']['exploratory']
    assert any('runs were added beyond the plan after the report of' in reason and
               '4 per configuration planned; now 8' in reason
               for reason in extended['looks']['reasons'])


def test_a_launch_that_retargets_after_runs_is_seen(tmp_path):
    """Without looks.json (an older study.py), a later launch that changes the target makes the
    claims exploratory; one repeating the first command does not (--runs: test_study_engine.py)."""
    study_dir = str(tmp_path / 'launches')
    make_study(study_dir, {'a': config('a')}, 4, target=0.94)
    add_runs(study_dir, 'a', NINE[:4])  # finished 2026-11-26T00:00:01
    first = ['study.py', 'airbench94', '--runs', '4', '--study-dir', study_dir, '--target',
             '0.94', '--', '--epochs', '1']
    for second, reasons in [
            (first, []),
            ([*first[:7], '0.939', *first[8:]], ['the target was set to 0.939 by the launch of '
                                                 '2026-11-26T01:00:00, after 4 runs were '
                                                 'finished (before: 0.94)'])]:
        rewrite_study(study_dir, launches=[
            dict(id=started[-2:], started=started, command=command,
                 environment=dict(world_size=1)) for started, command in
            (('2026-11-26T00:00:00', first), ('2026-11-26T01:00:00', second))])
        looks = study.write_outputs(study_dir)['looks']
        os.remove(os.path.join(study_dir, 'analysis', 'looks.json'))
        assert looks['exploratory'] == bool(reasons)
        assert all(any(said in reason for reason in looks['reasons']) for said in reasons)


def test_log_ticks_are_few_readable_and_inside_the_range():
    """Every minor tick of a range like 3e-9 to 1 was labelled, overprinting: now 2 to 8."""
    for low, high in ((3e-9, 1.0), (1e-3, 0.9), (0.02, 0.3), (0.035, 0.065), (0.0312, 0.0488),
                      (0.05, 0.051), (0.0078, 0.85)):
        ticks = plots.log_ticks(low, high)
        labels = [f'{tick:.3g}' for tick in ticks]
        assert 2 <= len(ticks) <= 8 and len(set(labels)) == len(labels), (low, high, ticks)
        assert all(low <= tick <= high for tick in ticks)


def test_epochs_plot_draws_no_law_where_none_fits_and_keeps_intervals_in_0_1(tmp_path, figures):
    """A fit stopped at a bound gets no line, a free one its line over the measured epochs; an
    interval past an accuracy of 1 is cut at an error of 0."""
    curve = dict(epochs=[1.0, 2.0, 4.0], mean_accuracy=[0.7, 0.9, 0.999],
                 ci_low=[0.6, 0.85, 0.99], ci_high=[0.8, 0.95, 1.004],
                 fit=dict(a=-9.9, b=0.3, c=0.0, at_bounds=['c']), lack_of_fit=None)
    free = dict(curve, mean_accuracy=[0.7, 0.8, 0.85], ci_low=[0.69, 0.79, 0.84],
                ci_high=[0.71, 0.81, 0.86], fit=dict(a=-1.0, b=0.3, c=0.0, at_bounds=[]),
                lack_of_fit=dict(p_value=0.5))
    import matplotlib.pyplot as plt
    plots.plot_epochs(str(tmp_path), dict(metric='accuracy', curves={'bound': curve,
                                                                    'free': free}), plt)
    axes = figures['epochs.png'].axes[0]
    lines = [line for line in axes.get_lines() if len(line.get_xdata()) == 100]
    assert len(lines) == 1 and min(lines[0].get_xdata()) == 1.0 and max(lines[0].get_xdata()) \
        == 4.0
    labels = [text.get_text() for text in axes.get_legend().get_texts()]
    assert labels == ['bound (no law fits)', 'free']
    errors, low, high = plots.error_bars(curve)
    assert low[2] == 0.0 and (high <= 1).all()
    bottom, top = axes.get_ylim()  # the smallest and largest error shown, with a margin
    assert (bottom, top) == pytest.approx((0.001 / 1.25, 0.4 * 1.25))


# The fits as the report shows them (studylib.analysis)

def speedup_of(curves, target=None, seeds=False):
    """analysis.speedup_analysis of {base: {epochs: per-run accuracies}} as a study would hold it
    (with seeds: run i of every cell has the same seeds, as study.py's design)."""
    configs = {}
    rows = []
    for base, curve in curves.items():
        for epochs, accuracies in curve.items():
            name = f'{base},train_epochs={epochs:g}'
            configs[name] = Config(name=name, script='airbench94', base=base,
                                   grid={'opt.train_epochs': f'{epochs:g}'},
                                   hyp={'opt': {'train_epochs': epochs}})
            rows += [dict(config=name, run=run, accuracy=a, **(
                dict(seed_init=run, seed_order=run, seed_aug=run) if seeds else {}))
                for run, a in enumerate(accuracies)]
    return analysis.speedup_analysis(pd.DataFrame(rows), configs, target=target)


def test_report_says_when_speedups_rest_on_a_misfit():
    """The summary carries each curve's fitted accuracies and bounds; the report marks every
    number derived from a curve whose fit stopped at a bound, and only those."""
    found = speedup_of({'random': SHORT_RANDOM, 'alternating': SHORT_ALTERNATING})
    random = found['curves']['random']
    assert random['fit']['at_bounds'] == ['c']
    assert random['fitted_accuracy'] == pytest.approx(
        [1 - fit_power_law([0.5, 1, 2], [1 - np.mean(SHORT_RANDOM[e]) for e in (0.5, 1, 2)])
         .error_at(e) for e in (0.5, 1, 2)])
    speedups = found['curves']['alternating']['speedup'].values()
    assert all(not s['reliable'] and 'stopped at the bound of c' in s['reason']
               for s in speedups if s['estimate'] is not None)
    notes = [line for line in markdown.speedup_lines(found) if line.startswith(markdown.DAGGER)]
    assert notes and all('stopped at the bound of c' in line for line in notes)
    free = speedup_of({'b': {e: [1 - float(LAW.error_at(e)) + d for d in (-0.001, 0, 0.001)]
                             for e in EPOCHS}})
    assert free['curves']['b']['fit']['at_bounds'] == []
    assert not [line for line in markdown.speedup_lines(free) if 'stopped at the bound' in line]


def test_curves_whose_runs_share_seeds_are_paired():
    """Run i of every cell shares its seeds (study.py's design): paired intervals, as fits'
    own with paired=True; rows without seeds are not."""
    runs = synthetic_runs(4, 0.0015, seed=11)
    faster = {e: 1 - float(LAW.error_at(1.25 * e)) + np.random.default_rng(12).normal(0, 0.0015, 4)
              for e in EPOCHS}
    found = speedup_of({'base': runs, 'fast': faster}, target=0.94, seeds=True)
    curve = found['curves']['fast']
    assert curve['design'] == 'paired' and curve['epochs_to_target']['paired']
    assert curve['epochs_to_target']['ci_low'] == pytest.approx(epochs_to_accuracy_interval(
        faster, 0.94, paired=True)['ci_low'])
    assert curve['speedup']['20.0']['ci_high'] == pytest.approx(effective_speedup_interval(
        runs, faster[20], 20, paired=True)['ci_high'])
    unseeded = speedup_of({'base': runs, 'fast': faster})
    assert unseeded['curves']['fast']['design'] == 'unpaired'


def test_report_flags_a_curve_that_no_power_law_fits():
    """Errors 0.055 + 0.25 exp(-epochs / 6): "bad fit" with its reason, and the speedups
    derived from the curve marked."""
    rng = np.random.default_rng(13)
    curve = {e: 1 - (0.055 + 0.25 * math.exp(-e / 6)) + rng.normal(0, 0.0015, 5)
             for e in (5, 10, 20, 40)}
    other = {e: values + 0.002 for e, values in curve.items()}
    found = speedup_of({'exponential': curve, 'other': other})
    assert found['curves']['exponential']['lack_of_fit']['p_value'] < 0.05
    lines = markdown.speedup_lines(found)
    assert any('bad fit' in line for line in lines)
    assert any(line.startswith(markdown.DAGGER) and 'does not fit' in line for line in lines)
    assert all(not s['reliable'] for s in found['curves']['other']['speedup'].values())


def test_what_compiling_cost_is_summed_per_configuration_and_stage():
    """Per configuration and stage: processes, seconds, inductor's counts; 'before the runs' is
    from studies of study.py at 576cd79 or before."""
    def record(config, stage, rank, seconds, compiled, from_cache, error=None):
        return CompileRecord(config=config, launch='L', stage=stage, rank=rank, host='h',
                             device='cuda:0', device_model='H100', seconds=seconds, graphs=6,
                             compiled=compiled, from_cache=from_cache, error=error)
    costs = analysis.compile_costs([
        record('a', 'before the runs', 0, 200.0, 12, 0), record('a', 'warmup', 0, 3.0, 0, 12),
        record('a', 'warmup', 1, 5.0, 0, 12), record('b', 'warmup', 0, 9.0, 0, 0, 'boom')])
    assert costs == [
        dict(config='a', stage='before the runs', processes=1, seconds_mean=200.0,
             seconds_max=200.0, graphs=6, compiled=12, from_cache=0, came_from={'compiled': 1}),
        dict(config='a', stage='warmup', processes=2, seconds_mean=4.0, seconds_max=5.0,
             graphs=6, compiled=0, from_cache=24, came_from={'cache': 2}),
        dict(config='b', stage='warmup', processes=1, seconds_mean=9.0, seconds_max=9.0,
             graphs=6, compiled=0, from_cache=0, came_from={'failed': 1})]
    lines = markdown.compile_lines(costs)
    assert '  | a | warmup | 2 | 4.0, 5.0 | 6 | 0, 24 | 2 cache |' in lines
    assert markdown.compile_lines([]) == []
