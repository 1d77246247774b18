"""tools/gpu_check.py, the machine's self-check: its parts (the error's first line from real
outputs, the commands, the items, the cache, what an item must leave); slow: the whole tool."""
import getpass
import glob
import json
import os
import re
import subprocess
import sys
import tempfile

import pytest
import torch

from conftest import REPO, write_image_folder

import gpu_check


def after_separator(command):
    """The flags after study.py's `--` (a script's whole command has none: all of it)."""
    return command[command.index('--') + 1:] if '--' in command else command


def values(command, flag):
    """Every value given to flag in a command line, in order."""
    return [command[i + 1] for i, word in enumerate(command[:-1]) if word == flag]


# Real outputs in tests/fixtures/gpu_check, abridged (torchrun's banner and frames, outer frames):
# airbench94.py --data-dir /tmp/nonexistent without network; the torchrun study on a missing data
# directory (rank 0's error, then ChildFailedError); the H100 study's ValueError in two torchrun
# workers; a chained exception; rank 1 SIGKILLed under torchrun (no traceback: its line restates
# torchrun's report, every other is a whole line of its output); a diverged run (on stdout).
ERROR_LINES = [
    ('script_error.stderr', 'error: No image folder (train/<class>/*, test/<class>/*) nor'),
    ('study_torchrun_error.stderr', 'error: No cifar10 dataset found in /tmp/nonexistent'),
    ('torchrun_traceback.stderr', 'ValueError: Expected a torch.device with a specified index'),
    ('chained_traceback.stderr', 'RuntimeError: cannot read the study: [Errno 2] No such file'),
    ('torchrun_killed.stderr', 'torchrun: rank 1 (local_rank: 1) ended with exit code -9 (pid: '
     '11147) (SIGKILL)'),
    ('diverged.stdout', 'error: run 0: the training loss became nan in epoch 0.')]


@pytest.mark.parametrize('name, expected', ERROR_LINES)
def test_the_first_line_of_an_items_real_error(name, expected):
    with open(os.path.join(REPO, 'tests', 'fixtures', 'gpu_check', name)) as f:
        text = f.read()
    stdout, stderr = (text, '') if name.endswith('.stdout') else ('', text)
    said = gpu_check.first_error_line(1, stdout, stderr, 600)
    assert said.startswith(expected)
    assert said in [line.strip() for line in text.splitlines()] or said == expected


def test_no_message_says_how_it_ended():
    assert gpu_check.first_error_line(1, 'trained\n', 'a warning\n', 600) == \
        'exit status 1, and no error message'
    assert gpu_check.first_error_line(-9, '', '', 600) == 'killed by SIGKILL'
    assert gpu_check.first_error_line(None, '', 'error: late\n', 12.5) == 'timed out after 12.5 s'
    long = 'error: ' + 'x' * 1000
    assert len(gpu_check.first_error_line(1, '', long, 600)) == gpu_check.LONGEST_MESSAGE


def test_devices_on_one_gpu_two_gpus_and_none():
    assert gpu_check.devices('auto', 1) == ('cuda', 'cuda:0')  # both processes on GPU 0
    assert gpu_check.devices('cuda', 1) == ('cuda', 'cuda:0')
    assert gpu_check.devices('auto', 2) == ('cuda', 'cuda')  # a GPU per process, by local rank
    assert gpu_check.devices('cuda:1', 2) == ('cuda:1', 'cuda:1')
    assert gpu_check.devices('auto', 0) == ('cpu', 'cpu')
    assert gpu_check.devices('cpu', 4) == ('cpu', 'cpu')
    for device, gpus, message in (('cuda', 0, 'sees no CUDA device'), ('cuda:2', 2, 'sees 2 CUDA'),
                                  ('gpu', 1, 'give auto, cpu, cuda or cuda:N'),
                                  ('cuda:x', 1, 'give auto')):
        with pytest.raises(ValueError, match=message):
            gpu_check.devices(device, gpus)


@pytest.mark.parametrize('gpus, shared', [(1, 'cuda:0'), (2, 'cuda')])
def test_the_commands_on_cuda(gpus, shared, tmp_path):
    made = gpu_check.commands(gpu_check.ITEMS, gpu_check.devices('auto', gpus), '/data/cifar10',
                              str(tmp_path), tiny=False)
    assert list(made) == gpu_check.ITEMS
    for name in gpu_check.SCRIPTS:
        command = made[name]
        assert command[:2] == [sys.executable, os.path.join(REPO, f'{name}.py')]
        assert values(command, '--runs') == ['1'] and values(command, '--seed') == ['0']
        assert values(command, '--device') == ['cuda'] and values(command, '--epochs') == ['4']
        assert '--no-warmup' not in command and '--hyp' not in command  # full networks, warmed
        assert values(command, '--log-dir') == [str(tmp_path / name / 'logs')]
    study = made['study']
    torchrun = made['study-torchrun']
    assert study[:2] == [sys.executable, gpu_check.STUDY]  # world size 1
    assert torchrun[:5] == [sys.executable, '-m', 'torch.distributed.run', '--standalone',
                            '--nproc_per_node=2']
    for command, device in ((study, 'cuda'), (torchrun, shared)):
        launch = command[:command.index('--')]
        assert launch[launch.index(gpu_check.STUDY) + 1] == 'airbench94_hiverge'
        assert values(launch, '--config') == ['hiverge', 'muon']
        assert launch[launch.index('muon') + 1] == 'airbench94_muon'
        assert values(launch, '--runs') == ['2']
        flags = after_separator(command)
        assert values(flags, '--device') == [device] and values(flags, '--epochs') == ['4']
        assert values(flags, '--data-dir') == ['/data/cifar10']
        assert '--dataset' not in flags  # CIFAR-10's layout: study.py's default
    assert values(study, '--study-dir') != values(torchrun, '--study-dir')


def test_tiny_commands_on_a_cpu_and_on_cuda(tmp_path):
    data_dir = str(tmp_path / 'folder')
    for split in ('train', 'test'):
        os.makedirs(os.path.join(data_dir, split))
    made = gpu_check.commands(gpu_check.ITEMS, gpu_check.devices('cpu', 0), data_dir,
                              str(tmp_path / 'work'), tiny=False)
    widths = {'block1': 8, 'block2': 16, 'block3': 16}
    for name, command in made.items():
        flags = after_separator(command)
        assert values(flags, '--device') == ['cpu'] and values(flags, '--epochs') == ['1']
        assert '--precision' not in flags  # the scripts' choice for the CPU, in every item
        if name in gpu_check.STUDIES:  # study.py's --hyp; an image folder is its --dataset folder
            hyp = {key: eval(value) for key, value in (setting.split('=', 1)
                                                       for setting in values(flags, '--hyp'))}
            assert values(flags, '--dataset') == ['folder']
        else:  # a script's main() with its hyp edited: the settings, then the script's flags
            assert command[1:3] == ['-c', gpu_check.MAIN_WITH_HYP] and '--hyp' not in command
            assert command[3] == os.path.join(REPO, f'{name}.py')
            hyp = json.loads(command[4])
        assert hyp.pop('opt.batch_size') == 32 and hyp.pop('net.widths') == widths
        assert hyp == ({'proxy.widths': widths} if name == 'airbench96_faster' else {})
    assert '--nproc_per_node=2' in made['study-torchrun']
    flags = gpu_check.training_flags('cuda:0')  # tiny on CUDA: the CUDA recipe, on tiny networks
    assert values(flags, '--device') == ['cuda:0'] and values(flags, '--epochs') == ['4']
    assert '--precision' not in flags and gpu_check.item_hyp('cuda:0', tiny=False) == {}
    assert gpu_check.item_hyp('cuda:0', tiny=True)['opt.batch_size'] == 32


def test_a_tiny_items_runner_sets_hyp_before_the_scripts_main(tmp_path, monkeypatch):
    """The runner of a tiny item, run here as `python -c` runs it: the script's main() sees the
    settings in its hyp (8 training images make no batch of 32) and the item's flags."""
    data_dir = write_image_folder(str(tmp_path / 'data'), num_classes=2, train_per_class=4,
                                  test_per_class=1)
    command = gpu_check.script_command('airbench94', 'cpu', data_dir, str(tmp_path), tiny=True)
    assert command[1:3] == ['-c', gpu_check.MAIN_WITH_HYP]
    monkeypatch.setattr(sys, 'argv', ['-c', *command[3:]])
    with pytest.raises(SystemExit) as exit:
        exec(command[2], {})
    assert exit.value.code == ('error: 8 training images make no full batch of 32; lower '
                               'opt.batch_size.')


def test_every_script_is_an_item_eager_ones_first_and_what_compiles_where():
    scripts = sorted(os.path.basename(path)[:-3] for path in glob.glob(f'{REPO}/airbench*.py'))
    assert sorted(gpu_check.SCRIPTS) == scripts
    order = gpu_check.ITEMS
    assert order[0] == 'airbench94' and order[-2:] == ['study', 'study-torchrun']
    assert max(map(order.index, gpu_check.EAGER)) < min(map(order.index, gpu_check.COMPILED))
    on_cuda = [name for name in order if gpu_check.compiles(name, 'cuda')]
    assert on_cuda == [*gpu_check.COMPILED, *gpu_check.STUDIES]
    assert [name for name in order if gpu_check.compiles(name, 'cpu')] == ['airbench94_compiled']


def test_only_selects_items_in_the_checks_order():
    assert gpu_check.selected(None) == gpu_check.ITEMS
    assert gpu_check.selected('study-torchrun, airbench94.py,airbench94_hiverge') == [
        'airbench94', 'airbench94_hiverge', 'study-torchrun']
    with pytest.raises(ValueError, match='no item airbench97, studies; choose from airbench94'):
        gpu_check.selected('airbench97,study,studies')
    with pytest.raises(ValueError, match='names no item'):
        gpu_check.selected(',')


@pytest.mark.parametrize('argv, message', [
    (['--only', 'nope'], "error: --only 'nope': no item nope; choose from"),
    (['--device', 'cuda'], 'error: --device cuda: torch .* sees no CUDA device here'),
    (['--timeout', '0'], 'error: --timeout takes seconds above 0, not 0'),
    (['--bogus'], 'error: unrecognized arguments: --bogus')])
def test_bad_input_is_refused_in_one_line(argv, message, monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, 'device_count', lambda: 0)
    with pytest.raises(SystemExit) as stopped:
        gpu_check.main(argv)
    assert stopped.value.code == 2
    out, err = capsys.readouterr()
    assert out == '' and err.count('\n') == 1 and re.match(message, err)


def test_keep_refuses_a_directory_that_holds_something(tmp_path, capsys):
    (tmp_path / 'study').mkdir()
    with pytest.raises(SystemExit):
        gpu_check.main(['--device', 'cpu', '--keep', str(tmp_path)])
    assert capsys.readouterr().err.startswith(f'error: --keep {tmp_path}: give a new or empty')
    gpu_check.check_keep(str(tmp_path / 'new'))  # new, or empty: taken
    gpu_check.check_keep(str(tmp_path / 'study'))


def test_the_compile_cache_is_torchs_and_an_items_new_files_are_counted(tmp_path, monkeypatch):
    monkeypatch.setenv('TORCHINDUCTOR_CACHE_DIR', str(tmp_path / 'cache'))
    assert gpu_check.inductor_cache_dir() == str(tmp_path / 'cache')
    monkeypatch.delenv('TORCHINDUCTOR_CACHE_DIR')
    assert gpu_check.inductor_cache_dir() == os.path.join(
        tempfile.gettempdir(), f'torchinductor_{getpass.getuser()}')
    cache = str(tmp_path)
    assert gpu_check.cache_files(cache) == set()
    assert ': empty, so every compile is cold' in gpu_check.cache_state(cache, set())
    os.makedirs(tmp_path / 'locks')
    (tmp_path / 'locks' / 'abc.lock').write_text('')  # a lock is not compiled code
    (tmp_path / 'fxgraph.lock').write_text('')
    before = gpu_check.cache_files(cache)
    assert before == set()
    os.makedirs(tmp_path / 'fxgraph' / 'ab')
    (tmp_path / 'fxgraph' / 'ab' / 'entry').write_text('graph')
    (tmp_path / 'cq3.py').write_text('kernel')
    after = gpu_check.cache_files(cache)
    assert after - before == {os.path.join('fxgraph', 'ab', 'entry'), 'cq3.py'}
    assert ': 2 files, so a graph compiled before' in gpu_check.cache_state(cache, after)
    assert gpu_check.compile_note(len(after - before), True) == 'compiled cold: 2 new cache files'
    assert gpu_check.compile_note(0, True) == 'compiled from the cache'
    assert gpu_check.compile_note(0, False) == ''


def write_json(path, content):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, 'w') as f:
        json.dump(content, f)


def test_a_script_passes_with_its_finished_run_logged(tmp_path):
    assert gpu_check.script_outcome(str(tmp_path))[0] == 'exit status 0, but 0 logs where one'
    log = tmp_path / 'logs' / 'uuid' / 'summary.json'
    write_json(log, dict(status='finished', runs_finished=1, warmup_seconds=190.34))
    assert gpu_check.script_outcome(str(tmp_path)) == (None, 'warmup 190.3 s')
    write_json(log, dict(status='interrupted', runs_finished=0, warmup_seconds=1))
    assert gpu_check.script_outcome(str(tmp_path))[0] == \
        'exit status 0, but its log says interrupted with 0 runs'


def test_a_study_passes_complete_with_every_run(tmp_path):
    study = tmp_path / 'study'
    write_json(study / 'summary.json', dict(status='complete'))
    for config in ('hiverge', 'muon'):
        for run in range(2):
            write_json(study / 'runs' / config / f'{run:05d}.json',
                       dict(device='cuda:0', rank=run, graphs_compiled_during_run=0))
    write_json(study / 'runs' / 'muon' / '00001.failed.json', dict(device='cuda:1', rank=1))
    assert gpu_check.study_outcome(str(tmp_path)) == (None, '4 runs on cuda:0 by rank 0, 1')
    os.remove(study / 'runs' / 'muon' / '00001.json')
    write_json(study / 'summary.json', dict(status='partial'))
    assert gpu_check.study_outcome(str(tmp_path))[0] == \
        'exit status 0, but its summary is partial with 3 of 4 runs recorded'


def test_an_items_line():
    assert gpu_check.item_line(True, 'airbench94', 41.23, ['', 'warmup 2.0 s', '']) == \
        'passed  airbench94.py             41.2 s  warmup 2.0 s'
    assert gpu_check.item_line(False, 'study', 3.1, ['ValueError: x', '', 'compiled cold: 3 '
                                                     'new cache files']) == \
        'failed  study.py, 1 process        3.1 s  ValueError: x; compiled cold: 3 new cache files'


def run_tool(tmp_path, *flags):
    """The tool on the CPU, its items' outputs kept in tmp_path/kept."""
    return subprocess.run([sys.executable, os.path.join(REPO, 'tools', 'gpu_check.py'), '--device',
                           'cpu', '--keep', str(tmp_path / 'kept'), *flags], cwd=tmp_path,
                          capture_output=True, text=True, timeout=900)


@pytest.mark.slow
def test_every_item_passes_on_the_cpu(tmp_path):
    """Every item passes, in order, and only airbench94_compiled, the one item that compiles on a
    CPU, says how (cold on a new machine, then from the cache: the test leaves the cache as is)."""
    data_dir = write_image_folder(str(tmp_path / 'data'))
    result = run_tool(tmp_path, '--data-dir', data_dir)
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    lines = result.stdout.splitlines()
    assert lines[0].startswith('device cpu (') and f'data {data_dir} (an image folder)' in lines[0]
    assert lines[1].startswith('inductor cache ')
    items = lines[2:-1]
    assert [line.split('  ')[1].strip() for line in items] == \
        [gpu_check.LABELS[name] for name in gpu_check.ITEMS]
    assert all(line.startswith('passed  ') for line in items), result.stdout
    said = {name: re.search(r'compiled (cold: [1-9]\d* new cache files|from the cache)$', line)
            for name, line in zip(gpu_check.ITEMS, items) if 'compiled' in line}
    assert list(said) == ['airbench94_compiled'] and said['airbench94_compiled'], result.stdout
    assert all(re.search(r' s  warmup [\d.]+ s', line) for line in items[:7]), result.stdout
    assert items[-2].endswith('  4 runs on cpu by rank 0')
    assert items[-1].endswith('  4 runs on cpu by rank 0, 1')  # both processes trained
    assert re.fullmatch(r'9 of 9 passed in [\d.]+ s; outputs in .*', lines[-1])
    assert all(os.path.exists(tmp_path / 'kept' / name / 'stdout.txt') for name in gpu_check.ITEMS)


@pytest.mark.slow
def test_a_failing_item_says_the_first_line_of_its_real_error(tmp_path):
    """A data directory that does not exist: each item's line says its process's `error:` line."""
    missing = str(tmp_path / 'missing')
    result = run_tool(tmp_path, '--data-dir', missing, '--only', 'airbench94,study-torchrun')
    assert result.returncode == 1, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == 5 and lines[-1].startswith('0 of 2 passed in ')
    for name, line in zip(['airbench94', 'study-torchrun'], lines[2:4]):
        with open(tmp_path / 'kept' / name / 'stderr.txt') as f:
            written = [text for text in f.read().splitlines() if text.startswith('error: ')]
        assert written and missing in written[0]
        assert re.fullmatch(rf'failed  {re.escape(gpu_check.LABELS[name])} +[\d.]+ s  '
                            rf'{re.escape(written[0])}', line), line
