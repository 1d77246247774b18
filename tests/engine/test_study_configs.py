"""study.py's configurations: any script, also outside the repository, grids, studies
that gain configurations, paired seeds across scripts, warmup before timing, load_study, the
report rebuilt without training, and bad input refused in one line."""
import json
import os

import pandas as pd
import pytest

from conftest import REPO, load_script
from test_study import records, record_files, study_main, study_summary, training  # noqa: F401

import study  # noqa: E402
from studylib import cli  # noqa: E402  (importable once study.py put the repository on the path)
from studylib.config import Config  # noqa: E402


def test_a_grid_expands_every_configuration_over_every_combination():
    args = cli.parse_args(['airbench94', '--runs', '1', '--study-dir', 'x', '--config', 'alt',
                           '--config', 'rnd', 'aug.flip=random', '--grid', 'opt.train_epochs=5,10',
                           '--grid', 'net.tta_level=0,2'])
    assert list(args.configs) == [
        f'{name},train_epochs={epochs},tta_level={tta}' for name in ('alt', 'rnd')
        for epochs in (5, 10) for tta in (0, 2)]
    config = args.configs['rnd,train_epochs=10,tta_level=0']
    assert config == Config(name='rnd,train_epochs=10,tta_level=0', script='airbench94',
                            overrides=['aug.flip=random', 'opt.train_epochs=10', 'net.tta_level=0'],
                            base='rnd', grid={'opt.train_epochs': '10', 'net.tta_level': '0'})
    alone = cli.parse_args(['airbench94', '--runs', '1', '--study-dir', 'x',
                            '--grid', 'opt.lr=1,2', '--grid', 'aug.lr=3'])  # two leaves 'lr'
    assert list(alone.configs) == ['opt.lr=1,aug.lr=3', 'opt.lr=2,aug.lr=3']
    for name in [*args.configs, *alone.configs]:  # legible and safe as directory names
        assert '/' not in name and ' ' not in name and name == name.strip('.')


LOADED = {}  # the scripts a test instruments, by path


def test_configurations_of_two_scripts_are_paired_and_each_warmed_up_before_timing(
        study_main, image_folder, tmp_path, monkeypatch):
    trains = []  # (script, dummy data or not) of every train() call, in order
    for name in ('airbench94', 'airbench95'):
        module = load_script(name)
        original = module.train

        def recording(data, *args, name=name, original=original, **kwargs):
            trains.append((name, len(data['train']['labels']) < 100))
            return original(data, *args, **kwargs)
        module.train = recording
        monkeypatch.setitem(LOADED, os.path.join(REPO, f'{name}.py'), module)
    import studylib.scripts
    monkeypatch.setattr(studylib.scripts, 'load_script', LOADED.__getitem__)
    study_dir = tmp_path / 'study'
    assert study_main(['airbench94', '--runs', '2', '--study-dir', str(study_dir),
                       '--config', 'a94', '--config', 'a95', 'airbench95',
                       '--grid', 'opt.train_epochs=1,2', '--', *training(epochs=None, warmup=True),
                       '--data-dir', image_folder]) == 0
    found = records(study_dir)
    assert len(found) == 8
    for run in range(2):  # run i: the same seeds whatever the script
        seeds = {found[(config, run)]['seeds'].__repr__() for config in
                 ('a94,train_epochs=1', 'a94,train_epochs=2', 'a95,train_epochs=1')}
        assert len(seeds) == 1
    assert found[('a95,train_epochs=1', 0)]['script'] == 'airbench95'
    # one warmup (on dummy data: fewer images) per script, whatever the epochs, before any run
    first_run = next(i for i, (_, dummy) in enumerate(trains) if not dummy)
    assert sorted(trains[:first_run]) == [('airbench94', True), ('airbench95', True)]
    assert not any(dummy for _, dummy in trains[first_run:])
    assert all(record['graphs_compiled_during_run'] == 0 for record in found.values())


def test_a_copy_outside_the_repository_is_a_configuration(study_main, image_folder, tmp_path):
    copy = tmp_path / 'experiments' / 'my_airbench.py'
    copy.parent.mkdir()
    source = open(os.path.join(REPO, 'airbench94.py')).read()
    copy.write_text(source.replace("'label_smoothing': 0.2,", "'label_smoothing': 0.1,"))
    study_dir = tmp_path / 'study'
    assert study_main(['airbench94', '--runs', '1', '--study-dir', str(study_dir),
                       '--config', 'ours', '--config', 'mine', str(copy),
                       '--', *training(), '--data-dir', image_folder]) == 0
    identity = json.load(open(study_dir / 'study.json'))['configs']
    assert identity['mine']['script'] == str(copy)
    assert identity['mine']['hyp']['opt']['label_smoothing'] == 0.1
    assert identity['ours']['hyp']['opt']['label_smoothing'] == 0.2
    found = records(study_dir)
    assert found[('mine', 0)]['seeds'] == found[('ours', 0)]['seeds']
    assert found[('mine', 0)]['epoch_train_losses'] != found[('ours', 0)]['epoch_train_losses']


def test_a_later_launch_adds_configurations_and_leaves_the_records_alone(
        study_main, image_folder, tmp_path, capsys):
    study_dir = tmp_path / 'study'
    flags = ['--', *training(), '--data-dir', image_folder]
    assert study_main(['airbench94', '--runs', '2', '--study-dir', str(study_dir),
                       '--config', 'a', *flags]) == 0
    before = record_files(study_dir)
    capsys.readouterr()
    assert study_main(['airbench94', '--runs', '2', '--study-dir', str(study_dir),
                       '--config', 'b', 'opt.lr=5', '--grid', 'opt.train_epochs=1,2', '--',
                       *training(epochs=None), '--data-dir', image_folder]) == 0
    after = record_files(study_dir)
    assert {path: after[path] for path in before} == before
    assert sorted(records(study_dir)) == sorted(
        [('a', 0), ('a', 1)] + [(f'b,train_epochs={e}', run) for e in (1, 2) for run in (0, 1)])
    saved = json.load(open(study_dir / 'study.json'))
    assert list(saved['configs']) == ['a', 'b,train_epochs=1', 'b,train_epochs=2']
    assert len(saved['commands']) == 2 and len(saved['launches']) == 2
    assert study_summary(study_dir)['configs']['a']['n'] == 2  # the summary covers the whole study
    assert study_main(['airbench94', '--runs', '2', '--study-dir', str(study_dir),
                       '--config', 'a', 'opt.lr=6', *flags]) == 1
    assert 'configs.a.hyp.opt.lr (11.5 there, 6 here)' in capsys.readouterr().err


def test_load_study_is_the_records_and_report_rebuilds_without_training(
        study_main, image_folder, tmp_path, capsys):
    study_dir = tmp_path / 'study'
    assert study_main(['airbench94', '--runs', '2', '--study-dir', str(study_dir), '--save-logits',
                       '--config', 'base', '--config', 'random', 'aug.flip=random', '--',
                       *training(), '--data-dir', image_folder]) == 0
    runs, arrays = study.load_study(str(study_dir))
    found = records(study_dir)
    assert len(runs) == len(found) == 4
    for _, row in runs.iterrows():
        record = found[(row['config'], row['run'])]
        for key in ('accuracy', 'total_time_seconds', 'steps', 'host', 'device_model', 'launch'):
            assert row[key] == record[key]
        assert [row[f'seed_{s}'] for s in ('init', 'order', 'aug')] == list(record['seeds'].values())
        assert row['aug.flip'] == ('random' if row['config'] == 'random' else 'alternating')
        logits = arrays['logits'][(row['config'], row['run'])]
        assert (logits.argmax(1) == arrays['test_labels']).mean() == pytest.approx(
            record['test_acc'])
    assert list(zip(runs['config'], runs['run'])) == [('base', 0), ('base', 1), ('random', 0),
                                                      ('random', 1)]  # the study's order
    csv = pd.read_csv(study_dir / 'runs.csv')
    assert list(csv['accuracy']) == list(runs['accuracy'])

    summary_before = json.load(open(study_dir / 'summary.json'))
    for name in ('summary.json', 'report.md', 'runs.csv', 'accuracy.png'):
        os.remove(study_dir / name)
    capsys.readouterr()
    assert study.main(['report', str(study_dir), '--variance']) == 0
    assert json.load(open(study_dir / 'summary.json'))['configs'] == summary_before['configs']
    assert '## Variance and calibration' in open(study_dir / 'report.md').read()
    assert study.main(['report', str(study_dir), '--speedup']) == 1
    error = capsys.readouterr().err
    assert error.startswith('error: no speedup analysis: the study needs a grid of 3 or more '
                            'epoch counts') and error.count('\n') == 1


def test_the_variance_analysis_needs_saved_logits(study_main, image_folder, tmp_path, capsys):
    study_dir = tmp_path / 'study'
    assert study_main(['airbench94', '--runs', '2', '--study-dir', str(study_dir), '--',
                       *training(), '--data-dir', image_folder]) == 0
    capsys.readouterr()
    assert study.main(['report', str(study_dir), '--variance']) == 1
    assert 'error: no variance analysis: the study needs saved logits (--save-logits' in \
        capsys.readouterr().err
    assert study.main(['report', str(tmp_path / 'nothing')]) == 1
    assert 'holds no study (no study.json)' in capsys.readouterr().err


BAD_CONFIGS = [  # study.py's flags, the message
    (['--config', 'mine', 'nowhere/copy.py'], 'nowhere/copy.py: no such file'),
    (['--config', 'mine', 'EMPTY'], 'lacks hyp, HYP_CHOICES, HYP_RANGES, train, build_net'),
    (['--grid', 'opt.learning_rate=1,2'], 'no hyperparameter opt.learning_rate'),
    (['--grid', 'aug.flip=random,sideways'], "--hyp aug.flip takes one of ('alternating'"),
    (['--grid', 'opt.lr=1,1'], '--grid opt.lr: a value is given twice'),
    (['--grid', 'opt.lr'], '--grid opt.lr: give KEY=V1,V2,...'),
    (['--grid', 'net.widths={1:2},3'], 'is not a number or a word'),
]


def test_the_flags_after_the_separator_then_the_overrides_set_hyp_in_that_order():
    """One owner, one order: the script's hyp, --epochs N as opt.train_epochs=N, each --hyp, then
    the configuration's overrides; a later one wins, and none is refused for another."""
    from studylib.cli import parse_flags
    from studylib.hyp import config_hyp
    script = load_script('airbench94')
    hyp = script.hyp

    def epochs(flags, overrides=()):
        return config_hyp(hyp, script.HYP_CHOICES, script.HYP_RANGES, parse_flags(flags),
                          overrides)['opt']['train_epochs']
    assert epochs([]) == hyp['opt']['train_epochs']
    assert epochs(['--epochs', '2']) == 2
    assert epochs(['--epochs', '2', '--hyp', 'opt.train_epochs=3']) == 3
    assert epochs(['--hyp', 'opt.train_epochs=3', '--epochs', '2']) == 3  # --epochs comes first
    assert epochs(['--epochs', '2', '--hyp', 'opt.train_epochs=3'], ['opt.train_epochs=4']) == 4


@pytest.mark.parametrize('flags, message', BAD_CONFIGS)
def test_bad_configurations_are_refused_in_one_line(flags, message, study_main, image_folder,
                                                    tmp_path, capsys):
    empty = tmp_path / 'empty.py'
    empty.write_text('"""Not a script of the airbench kind."""\n')
    flags = [str(empty) if flag == 'EMPTY' else flag for flag in flags]
    split = flags.index('--') if '--' in flags else len(flags)
    study_dir = tmp_path / 'study'
    assert study_main(['airbench94', '--runs', '1', '--study-dir', str(study_dir), *flags[:split],
                       '--', *training(), '--data-dir', image_folder, *flags[split + 1:]]) == 1
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith('error: ') and message in line
    assert not study_dir.exists()
