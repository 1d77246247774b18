"""Bad input gets a one-line message naming the problem and the fix, and nothing already computed
is lost: the data (the scripts' reader, which study.py calls), the flags, every hyp value
(study.py's checks, by each script's own rules), the cache, Ctrl-C. Below the banner the scripts
are one code (test_layout.py): it is tested on airbench94."""
import json
import os
import re
import signal
import subprocess
import time

import pytest
import torch

from conftest import (ALL_SCRIPTS, QUICK, QUICK_HYP, load_script, run_script, script_command,
                      set_hyp, study_dir, study_hyp, summary_of, tiny_dataset, tiny_hyp,
                      write_image_folder)

import studylib.data  # noqa: E402
from studylib.data import load_study_data  # noqa: E402
from studylib.errors import StorageError, StudyError  # noqa: E402

# The quickest complete run of airbench94: one epoch of batches of 32 of a tiny network, no TTA
TINY_HYP = {**tiny_hyp('airbench94'), 'net.tta_level': 0}
TINY = ['--epochs', '1', '--device', 'cpu']


@pytest.fixture(params=ALL_SCRIPTS)
def any_script(request):
    """Each of the seven scripts: the rules of their hyp differ."""
    return load_script(request.param)


def script_error(ab94, data_dir, tmp_path, capsys, monkeypatch):
    """What main() says, and exits with, on the data in data_dir."""
    set_hyp(monkeypatch, ab94, TINY_HYP)
    with pytest.raises(SystemExit) as exit:
        ab94.main(['--data-dir', str(data_dir), '--log-dir', str(tmp_path / 'logs'), *TINY])
    assert not (tmp_path / 'logs').exists()  # refused at the start: no log
    return str(exit.value.code) + capsys.readouterr().err


def study_error(data_dir, name='folder'):
    """What study.py's loader says on the data in data_dir."""
    with pytest.raises(StudyError) as error:
        load_study_data(name, str(data_dir), download=False)
    return str(error.value)


def test_missing_data_without_network_says_how_to_provide_it(ab94, tmp_path):
    with pytest.raises(ValueError) as error:  # without trying the network
        ab94.load_dataset(str(tmp_path / 'nothing'), download=False)
    message = str(error.value)
    assert message.startswith('No image folder (train/<class>/*, test/<class>/*) nor CIFAR-10')
    assert 'network access' in message and '--data-dir' in message
    assert study_error(tmp_path / 'nothing', 'cifar10') == message  # study.py calls the same
    with pytest.raises(StudyError) as error:  # study.py's own loader: CIFAR-100, SVHN
        load_study_data('cifar100', str(tmp_path / 'nothing'), download=False)
    message = str(error.value)
    assert 'No cifar100 dataset found' in message
    assert 'network access' in message and 'image-folder' in message and '--data-dir' in message


def test_a_directory_in_neither_layout_is_refused_alike_and_an_empty_one_gets_cifar10(
        ab94, tmp_path, capsys, monkeypatch):
    """Files but neither train/ and test/ nor CIFAR-10 (a mistyped path): refused rather than
    CIFAR-10 downloaded into it; an absent or empty one, or CIFAR-10's, is where CIFAR-10 goes."""
    (tmp_path / 'images').mkdir()
    (tmp_path / 'images' / 'a.png').write_bytes(b'')
    message = f'{tmp_path} is not in the image-folder layout: it needs the subdirectories train/, '
    said = script_error(ab94, tmp_path, tmp_path / 'run', capsys, monkeypatch)
    assert said == f'error: {study_error(tmp_path)}' and said.startswith(f'error: {message}test/')
    assert study_error(tmp_path, 'cifar10') == said.removeprefix('error: ')
    asked = []

    def offline_cifar10(root, train, download):
        asked.append(os.path.basename(root))
        raise OSError('offline')
    monkeypatch.setattr(ab94.torchvision.datasets, 'CIFAR10', offline_cifar10)
    for name in ('absent', 'empty', 'cifar'):
        with pytest.raises(ValueError, match='nor network access to download it'):
            ab94.load_dataset(str(tmp_path / name))
        (tmp_path / 'empty').mkdir(exist_ok=True)
        (tmp_path / 'cifar' / 'cifar-10-batches-py').mkdir(parents=True, exist_ok=True)
    assert asked == ['absent', 'empty', 'cifar']


def bad_image_folder(root, problem):
    """A small image folder with one problem; returns the image it damages."""
    write_image_folder(root, num_classes=3, train_per_class=2, test_per_class=1)
    bad = os.path.join(root, 'train', 'class_1', '0001.png')
    if problem == 'size':
        from PIL import Image
        Image.new('RGB', (40, 40)).save(bad)
    elif problem == 'unreadable':
        with open(bad, 'wb') as f:
            f.write(b'not a png')
    elif problem == 'classes':
        os.rename(os.path.join(root, 'test', 'class_2'), os.path.join(root, 'test', 'class_9'))
    elif problem == 'layout':
        for name in os.listdir(os.path.join(root, 'test')):
            os.rename(os.path.join(root, 'test', name), os.path.join(root, name))
    return bad


@pytest.mark.parametrize('problem, message', [
    ('size', '{bad} is 40x40 pixels, but these scripts train on 32x32 images and do not resize '
             'silently. Resize them first.'),
    ('unreadable', '{bad} could not be read as an image ('),
    ('classes', "{root}: train/ and test/ have different class directories (only in train: "
                "['class_2']; only in test: ['class_9']). All splits need the same classes."),
    ('layout', "{root}/test: Couldn't find any class folder"),
])
def test_bad_data_gets_the_same_one_line_message_from_the_script_and_study_py(
        problem, message, ab94, tmp_path, capsys, monkeypatch):
    root = str(tmp_path / 'data')
    bad = bad_image_folder(root, problem)
    said = script_error(ab94, root, tmp_path, capsys, monkeypatch)
    assert said.startswith('error: ' + message.format(bad=bad, root=root)), said
    assert 'Traceback' not in said and '\n' not in said.strip()
    assert said.strip() == f'error: {study_error(root)}'  # study.py reads with the script's reader


def test_the_cache_is_used_rebuilt_when_corrupt_or_stale_and_skipped_when_unwritable(
        tmp_path, monkeypatch):
    folder = write_image_folder(str(tmp_path / 'data'), num_classes=2, train_per_class=8,
                                test_per_class=2)
    first = load_study_data('folder', folder)
    messages = []
    load_study_data('folder', folder, log=messages.append)
    assert messages == []  # a cache that matches is used without decoding again
    cache = os.path.join(folder, 'airbench_cache.pt')
    with open(cache, 'r+b') as f:
        f.truncate(100)
    second = load_study_data('folder', folder, log=messages.append)
    assert any('unreadable' in m and 'rebuilding' in m for m in messages)
    assert torch.equal(second['train']['images'], first['train']['images'])
    assert os.path.getsize(cache) > 100
    from PIL import Image
    Image.new('RGB', (32, 32), (9, 9, 9)).save(os.path.join(folder, 'train', 'class_0', 'x.png'))
    third = load_study_data('folder', folder, log=messages.append)
    assert any('does not match' in m and 'fingerprint' in m for m in messages)
    assert len(third['train']['labels']) == 17
    # A full disk: said, and no half-written cache is left

    def full_disk(path, content):
        raise StorageError(f'{path} could not be written (No space left on device)')
    monkeypatch.setattr(studylib.data, 'atomic_write', full_disk)
    os.remove(cache)
    messages.clear()
    assert len(load_study_data('folder', folder, log=messages.append)['train']['labels']) == 17
    assert any(m.startswith('Could not write the tensor cache') and 'continuing without it' in m
               for m in messages)
    assert sorted(os.listdir(folder)) == ['test', 'train']


# A flag a script does not take, study.py's among them: one line naming the script's flags
NOT_A_SCRIPTS_FLAG = [['--hyp', 'opt.lr=3'], ['--hyp=aug.flip=random'], ['--precision', 'fp32'],
                      ['--no-warmup'], ['--dataset', 'cifar100'], ['--batch-size', '64']]
NONSENSICAL_FLAGS = [
    (['--runs', '0'], '--runs must be at least 1'),
    (['--runs', 'two'], "argument --runs: invalid int value: 'two'"),
    (['--epochs', '0'], '--epochs must be above 0, not 0.0'),
    (['--epochs', '-2'], '--epochs must be above 0, not -2.0'),
    (['--epochs', 'nan'], '--epochs must be above 0, not nan'),
    (['--device', 'toaster'], 'device string: toaster'),
    pytest.param(['--device', 'cuda'], 'sees no CUDA device', marks=pytest.mark.skipif(
        torch.cuda.is_available(), reason='this machine has CUDA')),
    # Not argparse's usage text: where the other values are, and study.py's flags
    *[(flags, 'airbench94.py takes --runs, --seed, --epochs, --data-dir, --device, --log-dir, '
              f'not {" ".join(flags)}: for other values edit hyp in airbench94.py, or see '
              "study.py's flags (python study.py airbench94 --runs N --study-dir DIR -- --help)")
      for flags in NOT_A_SCRIPTS_FLAG]]


@pytest.mark.slow
@pytest.mark.parametrize('flags, message', [NONSENSICAL_FLAGS[0], NONSENSICAL_FLAGS[-1],
                                            ([], 'nor network access to download it')])
def test_nonsensical_flags_and_missing_data(flags, message, tmp_path):
    """As a user meets it: one line on stderr, no log (data that is absent: without network)."""
    args = ['--data-dir', str(tmp_path / 'absent'), *flags]
    result = run_script('airbench94', *args, '--log-dir', str(tmp_path / 'logs'), timeout=120)
    assert result.returncode != 0 and result.stdout == ''
    assert result.stderr.startswith('error: ') and message in result.stderr
    assert result.stderr.count('\n') == 1 and not (tmp_path / 'logs').exists()


@pytest.mark.parametrize('flags, message', NONSENSICAL_FLAGS)
def test_nonsensical_flags_in_process(flags, message, ab94, tmp_path, capsys):
    """Exits with the message alone (a traceback would be an exception), before any log."""
    args = ['--data-dir', str(tmp_path), *flags]
    with pytest.raises(SystemExit) as exit:
        ab94.main([*args, '--log-dir', str(tmp_path / 'logs')])
    assert exit.value.code.startswith('error: ') and message in exit.value.code
    assert capsys.readouterr().err == '' and not (tmp_path / 'logs').exists()


def bad_values(default):
    """Values of another kind than a hyp entry's default, or out of any range it may have."""
    if isinstance(default, bool) or isinstance(default, str):
        return ['sideways', '7']
    if isinstance(default, dict):
        return ['3', "{'other': 1}"]
    if isinstance(default, tuple):
        return ['5', '(1, 2, 3)', '(-1, 2)']
    return ['-1', 'nan', 'inf', 'many', '1e999']


def study_refusal(script, setting):
    """study.py's message for `-- --hyp SETTING`; None where it takes it."""
    try:
        study_hyp(script, [setting])
    except StudyError as error:
        return str(error)
    return None


def test_every_hyp_value_of_the_wrong_kind_is_refused_by_name(any_script):
    """Before any training, naming the entry and what it takes (not a ZeroDivisionError later);
    the value hyp has is taken."""
    for group, entries in any_script.hyp.items():
        for name, default in entries.items():
            assert study_refusal(any_script, f'{group}.{name}={default!r}') is None
            for value in bad_values(default):
                said = study_refusal(any_script, f'{group}.{name}={value}')
                assert re.match(re.escape(f'--hyp {group}.{name}') + r'(\.\w+)? takes ',
                                said or ''), said


# Values outside what a method takes (the paper's switches' among them), each refused by every
# script whose hyp has the entry
OUT_OF_RANGE = [
    'opt.batch_size=0', 'opt.batch_size=2.5', 'opt.train_epochs=0', 'opt.train_epochs=-1',
    'opt.momentum=1', 'opt.label_smoothing=2', 'aug.translate=40', 'aug.cutout=33',
    "net.widths={'block1': 8, 'block2': 0, 'block3': 8}", 'net.tta_fraction=1.5',
    'aug.brightness=-0.1', 'opt.renorm_every=(0, 17)', 'proxy.step_every=0',
    'net.convs_per_block=4', 'opt.sampling=sometimes', 'net.whiten=no', 'net.identity_init=2',
    'opt.lookahead_every=-5', 'opt.lookahead_every=2.5', 'opt.lookahead_every=often',
    'aug.flip=sideways', 'net.tta_level=3']
TAKES = r'(\.block2)? takes (one of \(.+\)|a (whole )?number from \S+ to \S+), not '


def test_values_outside_what_the_method_takes_are_refused(any_script):
    keys = {f'{group}.{name}' for group, entries in any_script.hyp.items() for name in entries}
    settings = [setting for setting in OUT_OF_RANGE if setting.partition('=')[0] in keys]
    assert len(settings) >= 8
    for setting in settings:
        said = study_refusal(any_script, setting)
        assert re.match(re.escape(f'--hyp {setting.partition("=")[0]}') + TAKES, said or ''), said


def test_every_switch_value_and_the_edges_of_the_ranges_are_taken(ab94):
    run_hyp = study_hyp(ab94, ['net.whiten=False', 'net.identity_init=False', 'opt.bias_scaler=1',
                               'opt.lookahead_every=0', 'opt.sampling=replacement',
                               'aug.flip=random', 'net.tta_level=1'])
    opt = {'bias_scaler': 1, 'lookahead_every': 0, 'sampling': 'replacement'}
    assert run_hyp == {
        'opt': {**ab94.hyp['opt'], **opt}, 'aug': {**ab94.hyp['aug'], 'flip': 'random'},
        'net': {**ab94.hyp['net'], 'whiten': False, 'identity_init': False, 'tta_level': 1}}
    # A switch's False and True are also 0 and 1; one width is set by its own key
    for setting in ['opt.momentum=0.999', 'aug.cutout=32', 'aug.translate=31', 'net.whiten=0',
                    'opt.train_epochs=0.001', 'opt.label_smoothing=1', 'net.identity_init=1',
                    'net.widths.block1=32']:
        assert study_refusal(ab94, setting) is None, setting


@pytest.mark.slow
def test_diverging_loss_stops_with_a_message(image_folder, tmp_path):
    result = run_script('airbench94', '--data-dir', image_folder, '--runs', '2', '--seed', '0',
                        '--log-dir', str(tmp_path / 'logs'), *QUICK,
                        hyp={**QUICK_HYP, 'opt.lr': 1e30})
    assert result.returncode == 1
    assert 'the training loss became nan' in result.stdout or 'became inf' in result.stdout
    assert 'Lower the learning rate' in result.stdout and 'Traceback' not in result.stderr
    summary = summary_of(tmp_path / 'logs')
    assert summary['status'] == 'diverged' and summary['runs_finished'] == 0


def test_divergence_in_a_later_run_keeps_the_earlier_runs(ab94, tmp_path, monkeypatch):
    monkeypatch.setattr(ab94, 'load_dataset', lambda *a, **k: tiny_dataset())
    real_train = ab94.train
    seeds = []

    def train_diverging_on_second_run(data, hyp, device, precision, seed, *args, **kwargs):
        if 'on_epoch' not in kwargs:  # the warmup
            return real_train(data, hyp, device, precision, seed, *args, **kwargs)
        seeds.append(seed)
        if len(seeds) == 2:  # the loss the second run reports after its first epoch
            kwargs['on_epoch'](dict(epoch=0, train_loss=float('nan')))
        return real_train(data, hyp, device, precision, seed, *args, **kwargs)

    monkeypatch.setattr(ab94, 'train', train_diverging_on_second_run)
    set_hyp(monkeypatch, ab94, TINY_HYP)
    code = ab94.main(['--runs', '3', '--seed', '5', '--log-dir', str(tmp_path), *TINY])
    assert code == 1 and seeds == [5, 6]
    summary = json.loads((study_dir(tmp_path) / 'summary.json').read_text())
    assert summary['status'] == 'diverged' and summary['runs_finished'] == 1
    assert summary['runs'][0]['seed'] == 5 and len(summary['runs']) == 1


@pytest.mark.slow
def test_ctrl_c_keeps_finished_runs_and_says_how_many(image_folder, tmp_path):
    args = script_command('airbench94', '--data-dir', image_folder, '--runs', '50', '--seed', '0',
                          '--log-dir', str(tmp_path / 'logs'), *QUICK,
                          hyp={**tiny_hyp('airbench94'), **QUICK_HYP})
    # A background job without job control (`pytest &`, nohup, CI runners) ignores SIGINT, and its
    # children inherit that: give the child a terminal's foreground disposition
    process = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.time() + 600
    summary_path = None
    while time.time() < deadline:  # wait until the first run is in the log
        dirs = list((tmp_path / 'logs').iterdir()) if (tmp_path / 'logs').exists() else []
        if dirs and (dirs[0] / 'summary.json').exists():
            summary_path = dirs[0] / 'summary.json'
            if json.loads(summary_path.read_text())['runs_finished'] >= 1:
                break
        time.sleep(0.5)
    assert summary_path is not None
    process.send_signal(signal.SIGINT)
    try:  # the study stops within one training step; 300 s leaves room for a loaded machine
        stdout, stderr = process.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        process.kill()
        raise AssertionError('the study did not stop within 300 s of Ctrl-C') from None
    summary = json.loads(summary_path.read_text())
    assert process.returncode == 130, stderr
    assert summary['status'] == 'interrupted' and 1 <= summary['runs_finished'] < 50
    assert f"Interrupted: {summary['runs_finished']} of 50 runs finished" in stdout
    assert len(summary['runs']) == summary['runs_finished']
    assert 'Traceback' not in stderr
    assert not [p for p in summary_path.parent.iterdir() if '.tmp' in p.name]  # none half-written


def test_logs_are_replaced_atomically(ab94, tmp_path, monkeypatch):
    """A write that fails (a full disk) leaves the previous log whole."""
    monkeypatch.setattr(ab94, 'load_dataset', lambda *a, **k: tiny_dataset())
    writes = []

    class FullDisk:
        @staticmethod
        def dump(log, f, **kwargs):
            writes.append(log['runs_finished'])
            if len(writes) == 2:  # the second run's log
                f.write('{"runs": ')
                raise OSError(28, 'No space left on device')
            json.dump(log, f, **kwargs)
    monkeypatch.setattr(ab94, 'json', FullDisk)
    set_hyp(monkeypatch, ab94, TINY_HYP)
    with pytest.raises(OSError, match='No space left'):
        ab94.main(['--runs', '2', '--seed', '5', '--log-dir', str(tmp_path), *TINY])
    summary = json.loads((study_dir(tmp_path) / 'summary.json').read_text())
    assert writes == [1, 2] and summary['runs_finished'] == 1 and summary['status'] == 'running'
