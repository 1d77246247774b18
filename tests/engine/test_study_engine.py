"""study.py's engine, on the stand-in script (tests/stand_in_script.py: a known curve, train
returning at once): what it computes, its work per run, the studies it opens, what it needs of a
script, how it fails, the study directory's layout and studylib's layers."""
import ast
import dataclasses
import datetime
import fcntl
import glob
import json
import os
import shutil
import sys

import pytest
import torch

from conftest import REPO, load_script
from test_study import (METHOD_API_ONLY, STAND_IN, STAND_IN_FLAGS, accuracy_of, argv,  # noqa
                        image_folder, outputs_of, records, stand_in, study_main, study_summary,
                        training)

import studylib.looks  # noqa: E402
import studylib.plan  # noqa: E402
import studylib.report  # noqa: E402
import studylib.scripts  # noqa: E402
from studylib import cli  # noqa: E402
from studylib.cli import parse_flags  # noqa: E402
from studylib.config import Study, as_json  # noqa: E402
from studylib.data import load_study_data  # noqa: E402
from studylib.errors import StudyError  # noqa: E402
from studylib.files import StudyDir  # noqa: E402
from studylib.hyp import config_hyp  # noqa: E402
from studylib.scripts import METHOD_API, Method, open_script  # noqa: E402

FIXTURE = os.path.join(REPO, 'tests', 'fixtures', 'study_759d4b4')  # made by study.py of 759d4b4


def test_a_study_of_the_stand_in_gives_the_figures_of_its_curve(study_main, image_folder,
                                                                 tmp_path):
    """Each run the curve's accuracy for its seeds and saved logits of exactly that accuracy, the
    summary their means; and the report gives the engine's time between runs, from each run's
    start and finish in its record, over the mean run (on a GPU it must stay under 2%)."""
    assert study_main(argv(tmp_path, image_folder, '--save-logits', '--seed', '3', '--grid',
                           'opt.train_epochs=5,10', runs=5,
                           flags=[*STAND_IN_FLAGS, '--hyp', 'curve.noise=0.03'])) == 0
    labels = load_study_data('folder', image_folder)['test']['labels']
    found = records(tmp_path)
    assert sorted(found) == [(f'train_epochs={e}', run) for e in (10, 5) for run in range(5)]
    for (config, run), record in found.items():
        epochs = float(config.partition('=')[2])
        seeds = stand_in.source_seeds(3 + run)
        curve = {**stand_in.hyp['curve'], 'noise': 0.03}  # in steps of 1/128: runs differ
        expected = stand_in.accuracy_of(curve, epochs, seeds, len(labels))
        assert record['seeds'] == seeds and record['accuracy'] == record['test_acc'] == expected
        outputs = outputs_of(tmp_path, config, run)
        for key in ('logits', 'logits_plain'):  # the planned accuracy, exactly, in fp16
            assert outputs[key].dtype == torch.float16 and outputs[key].shape == (len(labels), 4)
            assert accuracy_of(outputs[key], labels) == expected
    summary = study_summary(tmp_path)
    assert summary['runs_finished'] == 10
    for epochs in (5, 10):
        accuracies = [found[(f'train_epochs={epochs}', run)]['accuracy'] for run in range(5)]
        entry = summary['configs'][f'train_epochs={epochs}']
        assert entry['n'] == 5 and entry['mean'] == pytest.approx(sum(accuracies) / 5)
    assert summary['configs']['train_epochs=10']['mean'] > summary['configs']['train_epochs=5'][
        'mean'] + 0.01  # the curve: 0.04 + 0.2 / epochs of error

    moments = sorted([datetime.datetime.fromisoformat(r[key]) for key in ('started', 'finished')]
                     for r in found.values())
    gaps = [(later[0] - earlier[1]).total_seconds() for earlier, later in zip(moments, moments[1:])]
    runs = [(finished - started).total_seconds() for started, finished in moments]
    assert all(gap >= 0 for gap in gaps) and all(run > 0 for run in runs)
    (launch,) = summary['launches']
    between = launch['between_runs']
    assert between['gaps'] == 9
    assert between['gap_seconds'] == pytest.approx(sum(gaps) / 9, abs=1e-6)
    assert between['fraction'] == pytest.approx(sum(gaps) / 9 / (sum(runs) / 10), rel=1e-6)
    report = (tmp_path / 'report.md').read_text()
    assert f"% of a run's {between['run_seconds']:.3g} s (9 gaps)" in report


ENGINE = {os.path.join(REPO, 'studylib', f'{name}.py') for name in (
    'cli', 'config', 'files', 'scripts', 'plan', 'distribute', 'collect', 'records', 'runs',
    'launch')}


def engine_lines(main, argv):
    """Lines of the engine's modules executed by a launch in this thread (a loop's every pass
    counts), its report left out."""
    count = [0]

    def local(frame, event, arg):
        count[0] += event == 'line'
        return local

    def calls(frame, event, arg):
        return local if frame.f_code.co_filename in ENGINE else None

    sys.settrace(calls)
    try:
        assert main(argv) == 0
    finally:
        sys.settrace(None)
    return count[0]


def test_the_engines_work_per_run_does_not_grow_with_the_runs(study_main, image_folder, tmp_path,
                                                              monkeypatch):
    monkeypatch.setattr(studylib.report, 'write_outputs', lambda *args, **kwargs: None)
    lines = {runs: engine_lines(study_main, argv(tmp_path / f'study{runs}', image_folder,
                                                 '--save-logits', runs=runs))
             for runs in (10, 20, 40)}
    per_run = [(lines[20] - lines[10]) / 10, (lines[40] - lines[20]) / 20]
    # linear: the same lines per run at any size (measured equal to the line; a pass over every
    # run per run would add half again, one line per run and run 2%)
    assert per_run[1] == pytest.approx(per_run[0], rel=0.01), lines


def stand_in_train(data, hyp, device, precision, seed, net=None, epoch_eval=True, on_epoch=None):
    """The stand-in's train, at once, for a script whose training is not what a test checks."""
    return stand_in.train(data, {**hyp, 'curve': stand_in.hyp['curve']}, device, precision, seed,
                          net, epoch_eval, on_epoch)


def test_a_study_made_by_the_study_py_of_before_opens_and_continues(study_main, image_folder,
                                                                    tmp_path, monkeypatch):
    study_dir = tmp_path / 'study'
    shutil.copytree(FIXTURE, study_dir)
    saved = json.load(open(study_dir / 'study.json'))
    assert Study.from_json(saved, 'study.json').to_json() == saved  # every field, as it was
    configs = ['--config', 'a', '--config', 'b', 'opt.lr=5']
    assert saved['commands'] == [['study.py', 'airbench94', '--runs', '2', '--study-dir', 'study',
                                  '--target', '0.5', *configs, '--', *training(), '--data-dir',
                                  'data']]
    before = {key: json.dumps(record, sort_keys=True) for key, record in records(study_dir).items()}
    # its airbench94 is that of its commit: give it today's code and hyp, the format kept
    script = open_script('airbench94')
    flags = parse_flags([*training(), '--data-dir', image_folder])
    for name, config in saved['configs'].items():
        config['script_sha256'] = script.sha256
        config['hyp'] = as_json(config_hyp(script.method.hyp, script.method.HYP_CHOICES,
                                           script.method.HYP_RANGES, flags, config['overrides']))
    (study_dir / 'study.json').write_text(json.dumps(saved))
    module = load_script('airbench94')  # its new runs trained by the stand-in's train
    monkeypatch.setattr(module, 'train', stand_in_train)
    assert study_main(argv(study_dir, image_folder, *configs, runs=3, script='airbench94',
                           flags=training()), module) == 0
    after = records(study_dir)
    assert sorted(after) == [(config, run) for config in ('a', 'b') for run in range(3)]
    assert {key: json.dumps(after[key], sort_keys=True) for key in before} == before
    study = json.load(open(study_dir / 'study.json'))
    assert study['runs'] == 3 and len(study['commands']) == 2 and len(study['launches']) == 2
    assert study['target'] == 0.5  # kept by a launch without --target
    assert study_summary(study_dir)['configs']['b']['n'] == 3
    # what each launch asked for: the new one recorded it, the old one's is read from its command
    old, new = study['launches']
    assert 'request' not in old and new['request'] == dict(
        runs=3, configs=[['a'], ['b', 'opt.lr=5']], grids=[], target=None)
    assert [studylib.looks.launch_request(launch) for launch in (old, new)] == [
        (2, frozenset({('a',), ('b', 'opt.lr=5')}), frozenset(), 0.5),
        (3, frozenset({('a',), ('b', 'opt.lr=5')}), frozenset(), None)]
    (reason,) = study_summary(study_dir)['looks']['reasons']  # the old launch's runs: 2
    assert 'extended the study (--runs 2 -> 3' in reason


@pytest.mark.parametrize('name, signature, message', [
    ('infer', None, 'lacks infer, which study.py needs: a copy defines the method (hyp, '
     'HYP_CHOICES, HYP_RANGES, train, build_net, infer, CifarLoader, source_seeds: a script\'s '
     'part above the banner), and needs nothing below it'),
    ('source_seeds', None, 'lacks source_seeds, which study.py needs'),
    ('train', 'def train(data, hyp, device, seed, precision, net=None, epoch_eval=True):',
     ': its train takes (data, hyp, device, seed, precision, net, epoch_eval) first, where '
     'study.py passes (data, hyp, device, precision, seed, net, epoch_eval)'),
    ('infer', 'def infer(net, images, autocast, tta_level, batch_size=2000):',
     ': its infer takes (net, images, autocast, tta_level) first')])
def test_a_copy_that_lacks_its_method_or_takes_other_parameters_is_refused_in_one_line(
        study_main, image_folder, tmp_path, capsys, name, signature, message):
    """A copy without a name of METHOD_API (renamed here) or whose function takes other
    parameters: refused before anything is made, in one line naming what it lacks or takes."""
    source = open(STAND_IN).read()
    start = source.index(f'def {name}(')
    end = source.index('\n', source.index('):', start))
    copy = tmp_path / 'mine.py'
    if signature is None:
        copy.write_text(source.replace(f'def {name}(', f'def no_{name}(', 1))
    else:
        copy.write_text(source[:start] + signature + source[end:])
    assert study_main(argv(tmp_path / 'study', image_folder, script=str(copy))) == 1
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(f'error: {copy}') and message in line
    assert not (tmp_path / 'study').exists()


def test_the_positional_script_in_no_config_is_the_baseline_and_said_so(
        study_main, image_folder, tmp_path, capsys):
    copy = tmp_path / 'copy.py'
    copy.write_text(open(STAND_IN).read().replace("'noise': 0.0015", "'noise': 0.003"))
    study_dir = tmp_path / 'study'
    assert study_main(argv(study_dir, image_folder, '--config', 'mine', str(copy), runs=2)) == 0
    assert sorted(records(study_dir)) == [(c, r) for c in ('mine', 'stand_in_script')
                                          for r in (0, 1)]
    assert list(json.load(open(study_dir / 'study.json'))['configs']) == ['stand_in_script',
                                                                         'mine']
    note = (f'the script {STAND_IN} is in no --config: it is trained as the configuration '
            'stand_in_script, the baseline of the comparisons')
    assert note in capsys.readouterr().out.splitlines()
    with pytest.raises(StudyError, match=r'the script airbench94 is in no --config \(each names '
                       r'its own SCRIPT\): give it one, --config NAME first'):
        cli.parse_args(['airbench94', '--runs', '1', '--study-dir', 'x', '--config', 'airbench94',
                        str(copy)])


def test_a_name_that_is_a_file_here_and_a_script_of_the_repository_is_refused(tmp_path,
                                                                              monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / 'airbench94.py').write_text(open(os.path.join(REPO, 'airbench94.py')).read())
    with pytest.raises(StudyError) as refused:
        cli.parse_args(['airbench94.py', '--runs', '1', '--study-dir', 'x'])
    assert str(refused.value) == (
        f'airbench94.py is both a file here ({tmp_path}/airbench94.py) and a script of the '
        f"repository ({REPO}/airbench94.py): give ./airbench94.py for the file here, or "
        "airbench94 for the repository's")
    with pytest.raises(StudyError, match='airbench94.py is both a file here'):
        cli.parse_args(['airbench94', '--runs', '1', '--study-dir', 'x', '--config', 'a',
                        '--config', 'b', 'airbench94.py'])
    here = cli.parse_args(['./airbench94.py', '--runs', '1', '--study-dir', 'x'])
    ours = cli.parse_args(['airbench94', '--runs', '1', '--study-dir', 'x'])
    assert here.configs['baseline'].script == str(tmp_path / 'airbench94.py')
    assert ours.configs['baseline'].script == 'airbench94'
    monkeypatch.chdir(REPO)  # the repository's own file, named from its directory: no ambiguity
    assert cli.parse_args(['airbench94.py', '--runs', '1', '--study-dir', 'x']).script == \
        'airbench94'


def failing_report(*args, **kwargs):
    raise ValueError('an analysis failed\nwith a second line')


def test_a_report_that_fails_leaves_the_runs_their_exit_status_and_the_lock(
        study_main, image_folder, tmp_path, monkeypatch, capsys):
    """The runs are written whatever the analyses raise: a launch whose report fails exits 3 (look,
    not retry), as `study.py report` does, saying how to rebuild it; a launch stopped by Ctrl-C
    exits 130 all the same, the failure a warning. The lock is released either way. A directory
    that holds no study: 1."""
    assert study_main(['report', str(tmp_path / 'nothing')]) == 1  # refused
    assert 'holds no study' in capsys.readouterr().err
    monkeypatch.setattr(studylib.report, 'write_outputs', failing_report)
    assert study_main(argv(tmp_path, image_folder, runs=2)) == 3
    failure = (f'the report of {tmp_path} could not be written (ValueError: an analysis '
               f'failed); the runs are kept: rebuild it with python study.py report {tmp_path}')
    assert capsys.readouterr().err.splitlines() == [f'error: {failure}']
    assert len(records(tmp_path)) == 2
    assert study_main(['report', str(tmp_path)]) == 3
    assert capsys.readouterr().err.splitlines() == [f'error: {failure}']
    with open(tmp_path / 'study.lock', 'w') as lock:  # closed: another launch may take it
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)

    train = stand_in.train

    def interrupted(data, hyp, *args, **kwargs):
        if len(records(tmp_path)) == 3:
            raise KeyboardInterrupt
        return train(data, hyp, *args, **kwargs)
    monkeypatch.setattr(stand_in, 'train', interrupted)
    assert study_main(argv(tmp_path, image_folder, runs=4), stand_in) == 130  # not the report's
    assert capsys.readouterr().err.splitlines() == [
        f'warning: {failure}', '', f'Stopped: 3 of 4 finished runs are in {tmp_path}; the same '
        'command continues the study.']
    with open(tmp_path / 'study.lock', 'w') as lock:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)


def test_every_file_of_a_study_is_a_path_that_studydir_names(study_main, image_folder, tmp_path):
    """files.StudyDir knows the study directory's layout: after a launch with every optional file
    (saved logits, a validation split, a damaged record set aside, two launches, the report with
    its plots, variance tallies and looks), every file under DIR is a path it names."""
    study_dir = tmp_path / 'study'
    command = argv(study_dir, image_folder, '--save-logits', '--val-split', '16', '--config', 'a',
                   '--config', 'b', 'curve.c=0.05', runs=2, flags=[*STAND_IN_FLAGS, '--warmup'])
    assert study_main(command, plots=True) == 0
    (study_dir / 'runs' / 'a' / '00001.json').write_text('{')  # damaged: set aside, trained again
    assert study_main(command, plots=True) == 0
    files = StudyDir(str(study_dir))
    launches = [launch['id'] for launch in json.load(open(files.study_json()))['launches']]
    named = {files.study_json(), files.study_copy(), files.lock(), files.test_labels(),
             files.validation(), files.summary(), files.runs_csv(), files.report(),
             files.looks(), *map(files.plot, ('accuracy.png', 'time.png')),
             *map(files.compiles, launches),
             *(path for config in ('a', 'b') for run in range(2)
               for path in (files.record(config, run), files.outputs(config, run))),
             *(files.tally(config, key) for config in ('a', 'b')
               for key in ('logits', 'logits_plain'))}
    found = {os.path.join(root, name) for root, _, names in os.walk(study_dir) for name in names}
    set_aside = {path for path in found if path.startswith(files.set_aside() + os.sep)}
    assert sorted(os.path.basename(path) for path in set_aside) == [
        '00001.json.unreadable', '00001.pt.unreadable']  # the record, with its outputs
    assert found - set_aside == named


def test_no_module_but_files_joins_a_path_under_a_study_directory():
    """The layout is files.StudyDir's alone: elsewhere in studylib no os.path.join starts from a
    study directory (a name with study in it)."""
    joins = []
    for path in glob.glob(os.path.join(REPO, 'studylib', '**', '*.py'), recursive=True):
        for node in ast.walk(ast.parse(open(path).read())):
            if isinstance(node, ast.Call) and ast.unparse(node.func) == 'os.path.join':
                joins.append((os.path.basename(path), ast.unparse(node.args[0])))
    assert [join for join in joins if 'study' in join[1] and join[0] != 'files.py'] == []
    assert ('files.py', 'self.root') in joins  # the check sees the joins that are there


class NamesRead:
    """A module whose every attribute read is written down."""

    def __init__(self, module, names):
        self._module = module
        self._names = names

    def __getattr__(self, name):
        self._names.add(name)
        return getattr(self._module, name)


def test_a_script_of_only_what_method_api_names_runs_a_study_reading_no_other_name(
        study_main, image_folder, tmp_path, monkeypatch):
    """METHOD_API is the whole contract: the engine holds a loaded script as its Method (those
    names, no other); a script that defines those names alone (and imports) runs a study with all
    that uses them (warmups, saved logits, a validation split, two configurations of different
    TTA, the report), and the study reads from it those names and no other."""
    assert [field.name for field in dataclasses.fields(Method)] == list(METHOD_API)
    tree = ast.parse(open(METHOD_API_ONLY).read())
    defined = {target.id for node in tree.body if isinstance(node, ast.Assign)
               for target in node.targets} | {node.name for node in tree.body if isinstance(
                   node, (ast.FunctionDef, ast.ClassDef))}
    assert defined == set(METHOD_API)
    names = set()
    open_script = studylib.plan.open_script

    def recorded(label):
        script = open_script(label)
        return dataclasses.replace(script, method=NamesRead(script.method, names))
    monkeypatch.setattr(studylib.plan, 'open_script', recorded)
    assert study_main(argv(tmp_path, image_folder, '--save-logits', '--val-split', '32',
                           '--config', 'plain', '--config', 'mirror', 'net.tta_level=1', runs=2,
                           script=METHOD_API_ONLY,
                           flags=['--dataset', 'folder', '--device', 'cpu'])) == 0
    assert {'hyp', 'train', 'build_net', 'infer'} <= names <= set(METHOD_API), names
    found = records(tmp_path)
    assert sorted(found) == [(config, run) for config in ('mirror', 'plain') for run in (0, 1)]
    assert all(record['accuracy'] > 0.5 and record['accuracy_on'] == 'validation'
               for record in found.values())  # 4 classes: chance is 0.25
    assert outputs_of(tmp_path, 'plain', 0)['logits'].shape == (128, 4)


def studylib_imports(path):
    """The modules of studylib that a module's source imports ('stats.fits', 'config', ...)."""
    package = os.path.relpath(os.path.dirname(path), REPO).replace(os.sep, '.')
    found = set()
    for node in ast.walk(ast.parse(open(path).read())):
        if isinstance(node, ast.ImportFrom) and node.level:  # '.' the package, '..' its parent
            where = package.rsplit('.', node.level - 1)[0]
            where = f'{where}.{node.module}' if node.module else where
            names = [where, *(f'{where}.{alias.name}' for alias in node.names)]
            found |= {name.removeprefix('studylib.') for name in names}
    return found


def test_no_module_of_studylib_imports_from_a_layer_above_its_own():
    """studylib's layers (its docstring): the statistics, the study directory, the reports, the
    engine, the command line; each module imports only from its layer and those below (so the
    statistics import nothing of the engine, and the engine never the command line)."""
    import studylib
    layer = {module: i for i, modules in enumerate(studylib.LAYERS) for module in modules}
    paths = glob.glob(os.path.join(REPO, 'studylib', '**', '*.py'), recursive=True)
    modules = {os.path.relpath(p, os.path.join(REPO, 'studylib'))[:-3].replace(os.sep, '.'): p
               for p in paths if not p.endswith('__init__.py')}
    assert set(modules) == set(layer)  # every module has its layer
    upward = [(module, imported) for module, path in modules.items()
              for imported in studylib_imports(path)
              if imported in layer and layer[imported] > layer[module]]
    assert upward == []
    assert {'stats.inference'} <= studylib_imports(modules['stats.fits'])  # the reading works
    assert {'stats.fits', 'stats.inference'} <= studylib_imports(modules['analysis'])
    assert {'launch', 'report'} <= studylib_imports(modules['cli'])
