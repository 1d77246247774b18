"""study.py: every run trained once across processes and machines; what a run is given and
saves; the configurations; bad input refused. The helpers of the engine's other test files."""
import fcntl
import glob
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time

import pandas as pd
import pytest
import torch

from conftest import REPO, descendants, free_port, load_script, torchrun, write_image_folder

import study  # noqa: E402
import studylib.plots  # noqa: E402
import studylib.report  # noqa: E402
import studylib.scripts  # noqa: E402
from studylib import cli, distribute  # noqa: E402
from studylib.cli import parse_flags  # noqa: E402
from studylib.config import Config, Study  # noqa: E402
from studylib.data import load_study_data  # noqa: E402
from studylib.hyp import config_hyp  # noqa: E402
from studylib.records import CompileRecord  # noqa: E402

STUDY = os.path.join(REPO, 'study.py')
ENV = {**{key: value for key, value in os.environ.items()
          if key not in ('RANK', 'WORLD_SIZE', 'LOCAL_RANK')}, 'OMP_NUM_THREADS': '1'}
SOURCES = ('init', 'order', 'aug')
# tests/stand_in_script.py: its train returns at once, so a study of it is the engine's own work
STAND_IN = os.path.join(REPO, 'tests', 'stand_in_script.py')
STAND_IN_FLAGS = ['--dataset', 'folder', '--device', 'cpu', '--precision', 'fp32', '--no-warmup']
# A script of METHOD_API's names alone: a linear network, trained for real in a moment
METHOD_API_ONLY = os.path.join(REPO, 'tests', 'fixtures', 'method_api_only.py')
stand_in = load_script(STAND_IN)


def training(width=16, epochs=1, warmup=False):
    """A script's flags for a tiny training: 0.3 s per run at width 16 on one CPU core, about 1 s
    at 32 and 2 epochs; epochs=None leaves the epochs to the configurations."""
    widths = {'block1': width, 'block2': width, 'block3': width}
    return ['--dataset', 'folder', '--hyp', 'opt.batch_size=32', '--hyp', f'net.widths={widths}',
            *(['--epochs', str(epochs)] if epochs else []), '--device', 'cpu',
            '--precision', 'fp32', '--no-epoch-eval', '--warmup' if warmup else '--no-warmup']


def argv(study_dir, data_dir, *study_flags, runs=1, script=STAND_IN, flags=STAND_IN_FLAGS):
    """study.py's command line: study.py's flags, then the script's after -- and the data."""
    return [script, '--runs', str(runs), '--study-dir', str(study_dir), *study_flags, '--',
            *flags, '--data-dir', data_dir]


def records(study_dir):
    """{(config, run): record} of the finished runs (not the tries of failed ones)."""
    return {(r['config'], r['run']): r for r in
            (json.load(open(path)) for path in glob.glob(f'{study_dir}/runs/*/*.json')
             if not path.endswith('.failed.json'))}


def outputs_of(study_dir, config, run):
    return torch.load(os.path.join(study_dir, 'runs', config, f'{run:05d}.pt'))


def accuracy_of(logits, labels):
    return (logits.argmax(1) == labels).float().mean().item()


def record_files(study_dir):
    """{path: bytes} of the records and outputs under DIR/runs (not a killed write's .tmp)."""
    return {path: open(path, 'rb').read() for path in glob.glob(f'{study_dir}/runs/*/*')
            if '.tmp' not in path}


def trained(output):
    """(config, run) of each progress line rank 0 printed: one per run trained."""
    return [(config, int(run)) for config, run in
            re.findall(r'^\[\d+/\d+ done.*?\] (\S+) run (\d+):', output, re.MULTILINE)]


def study_summary(study_dir):
    return json.load(open(os.path.join(study_dir, 'summary.json')))


def wait_for(condition, timeout=120):
    deadline = time.time() + timeout
    while not condition():
        assert time.time() < deadline, 'timed out'
        time.sleep(0.05)


def launch(*args, launcher=(), **options):
    """study.py in a new process (under torchrun when launcher flags are given)."""
    command = [*torchrun(*launcher), STUDY, *args] if launcher else [sys.executable, STUDY, *args]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=ENV, **options)


def finish(process, timeout=180):
    stdout, stderr = process.communicate(timeout=timeout)
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


@pytest.fixture(scope='session')
def image_folder(tmp_path_factory):
    """One per session, decoded once into its tensor cache (the only file a study writes there)."""
    return write_image_folder(str(tmp_path_factory.mktemp('engine') / 'data'))


@pytest.fixture
def study_main(monkeypatch):
    """study.main in this process, on a script module a test may instrument; plots if asked."""
    for key in ('RANK', 'WORLD_SIZE', 'LOCAL_RANK'):
        monkeypatch.delenv(key, raising=False)

    def main(argv, script=None, plots=False):
        if script is not None:
            monkeypatch.setattr(studylib.scripts, 'load_script', lambda path: script)
        monkeypatch.setattr(studylib.report, 'plot', studylib.plots.plot if plots else
                            lambda *args: None)
        return study.main(argv)
    return main


@pytest.mark.slow
def test_two_processes_train_every_run_once_and_rank_0_reports(image_folder, tmp_path):
    study_dir = tmp_path / 'study'
    result = finish(launch(
        'airbench94', '--runs', '4', '--study-dir', str(study_dir), '--target', '0.5',
        '--config', 'base', '--config', 'lr5', 'opt.lr=5', '--',
        *training(warmup=True), '--data-dir', image_folder,
        launcher=['--nproc_per_node=2', f'--master-port={free_port()}']))
    assert result.returncode == 0, result.stderr[-3000:]
    every_run = [(config, run) for config in ('base', 'lr5') for run in range(4)]
    assert sorted(trained(result.stdout)) == every_run  # each trained once, reported by rank 0
    found = records(study_dir)
    assert sorted(found) == every_run
    assert {record['rank'] for record in found.values()} == {0, 1}
    script = load_script('airbench94')
    for (config, run), record in found.items():  # run i: the same seeds in every configuration
        assert record['seed'] == run and record['seeds'] == script.source_seeds(run)
    summary = study_summary(study_dir)  # its statistics: test_report.py's
    assert summary['status'] == 'complete' and summary['runs_finished'] == 8
    assert summary['configs']['base']['n'] == 4
    assert summary['comparisons']['comparisons'][0]['test'] == 'paired t-test'
    (first_launch,) = summary['launches']
    environment = first_launch['environment']
    assert environment['world_size'] == 2 and environment['hosts'] == socket.gethostname()
    assert environment['torch'] == torch.__version__ and environment['cpu']
    assert environment['gpu_count'] == 0 and environment['device'] == 'cpu'
    report = open(study_dir / 'report.md').read()
    assert f"| base | six views | 4 |  |  | {summary['configs']['base']['mean']:.4f} |" in report
    assert '| lr5 | base |' in report and 'world_size 2' in report
    for plot in ('accuracy.png', 'time.png'):
        assert open(study_dir / plot, 'rb').read(8) == b'\x89PNG\r\n\x1a\n'


def two_node_launch(node, port, study_dir, data_dir, *flags, rendezvous='static', restarts=0):
    """One "machine" of a two-node study on localhost, at the rendezvous on port."""
    where = [f'--node-rank={node}'] if rendezvous == 'static' else ['--rdzv-backend=c10d',
                                                                   '--rdzv-id=test']
    return launch('airbench94', '--study-dir', str(study_dir), *flags, '--data-dir', data_dir,
                  launcher=['--nnodes=2', '--nproc_per_node=1', f'--max-restarts={restarts}',
                            f'--rdzv-endpoint=127.0.0.1:{port}', *where])


@pytest.mark.slow
def test_two_nodes_without_a_shared_filesystem_complete_a_study_though_one_is_lost(tmp_path):
    """Rank 0 alone writes DIR and says the runs; the run of the machine lost mid-run is trained
    by the other in the same launch, once its heartbeat is silent for --lost-after seconds."""
    data_dirs = [write_image_folder(str(tmp_path / f'data{node}')) for node in (0, 1)]
    study_dirs = [tmp_path / f'study{node}' for node in (0, 1)]
    port = free_port()
    flags = ['--runs', '6', '--lost-after', '2', '--', *training(width=32, epochs=2)]
    nodes = [two_node_launch(node, port, study_dirs[node], data_dirs[node], *flags)
             for node in (0, 1)]
    wait_for(lambda: any(record['rank'] == 1 for record in records(study_dirs[0]).values()))
    for pid in [*descendants(nodes[1].pid), nodes[1].pid]:  # the whole machine, mid-run
        os.kill(pid, signal.SIGKILL)
    node1_output = nodes[1].communicate()[0]
    # torchrun on node 0 then waits for the lost node's agent at its exit barrier: the test stops it
    wait_for(lambda: os.path.exists(study_dirs[0] / 'summary.json') and
             study_summary(study_dirs[0])['status'] == 'complete', timeout=180)
    nodes[0].terminate()
    node0 = finish(nodes[0])
    every_run = [('baseline', run) for run in range(6)]
    assert sorted(records(study_dirs[0])) == every_run
    assert sorted(trained(node0.stdout)) == every_run and trained(node1_output) == []  # once each
    assert not study_dirs[1].exists()
    assert study_summary(study_dirs[0])['launches'][0]['environment']['world_size'] == 2


@pytest.mark.slow
def test_processes_that_see_different_data_are_refused(tmp_path):
    data_dirs = [write_image_folder(str(tmp_path / f'data{node}'), seed=node) for node in (0, 1)]
    port = free_port()
    nodes = [two_node_launch(node, port, tmp_path / 'study', data_dirs[node], '--runs', '1', '--',
                             *training()) for node in (0, 1)]
    node0, node1 = [finish(node) for node in nodes]
    assert node0.returncode != 0 and node1.returncode != 0
    assert (f'error: the processes see different data: rank 0 ({socket.gethostname()}) and rank 1'
            in node0.stderr)
    assert 'error:' not in node1.stderr  # said once, by rank 0
    assert not os.path.exists(tmp_path / 'study')


@pytest.mark.parametrize('vary', SOURCES)
def test_varying_one_source_holds_the_others(vary, study_main, image_folder, tmp_path):
    """Run i gives train() the varied source's seed of seed + i, the others' of the seed (that a
    script uses each for its own source is tests/scripts/test_method.py's)."""
    assert study_main(argv(tmp_path, image_folder, '--seed', '7', '--vary', vary, runs=2)) == 0
    found = records(tmp_path)
    for run in range(2):
        assert found[('baseline', run)]['seeds'] == {
            source: stand_in.source_seeds(7 + run if source == vary else 7)[source]
            for source in SOURCES}


def test_a_subset_trains_on_its_masked_images_and_validation_is_held_out(
        study_main, image_folder, tmp_path, monkeypatch):
    calls = []
    module = load_script(STAND_IN)
    train = module.train

    def recording_train(data, *args, **kwargs):
        result = train(data, *args, **kwargs)
        calls.append(dict(train=data['train'], evaluated=data['test'],
                          accuracy=result['tta_val_acc']))
        return result

    monkeypatch.setattr(module, 'train', recording_train)
    assert study_main(argv(tmp_path, image_folder, '--save-logits', '--train-subset', '0.5',
                           '--val-split', '64', runs=2), module) == 0
    data = load_study_data('folder', image_folder)
    images = data['train']['images']
    labels = data['train']['labels']
    held_out = json.load(open(tmp_path / 'validation.json'))['indices']
    assert len(set(held_out)) == 64 and max(held_out) < len(labels)
    masks = []
    for run, call in enumerate(calls):  # no warmup: one train() per run
        record = records(tmp_path)[('baseline', run)]
        outputs = outputs_of(tmp_path, 'baseline', run)
        mask = outputs['train_mask']
        masks.append(mask)
        assert mask.dtype == torch.bool and len(mask) == len(labels)
        assert not mask[held_out].any() and mask.sum() == round(0.5 * (len(labels) - 64))
        assert torch.equal(call['train']['images'], images[mask])
        assert torch.equal(call['train']['labels'], labels[mask])
        # evaluated on the held-out training images, and tested on the test set too
        assert torch.equal(call['evaluated']['images'], images[held_out])
        assert torch.equal(call['evaluated']['labels'], labels[held_out])
        assert record['accuracy_on'] == 'validation' and record['accuracy'] == call['accuracy']
        logits = outputs['logits']
        assert logits.dtype == torch.float16 and logits.shape == (len(data['test']['labels']), 4)
        assert accuracy_of(logits, data['test']['labels']) == record['test_acc']
    assert not torch.equal(masks[0], masks[1])  # each run its own subset
    assert study_summary(tmp_path)['accuracy_on'] == 'validation'


def test_saved_logits_travel_in_chunks_and_give_the_scripts_own_accuracy(
        study_main, image_folder, tmp_path, monkeypatch, capsys):
    """The engine evaluates as airbench94's train() does (its normalization, its TTA): to the bit.
    Outputs too large for the store are refused before training."""
    monkeypatch.setattr(distribute, 'CHUNK_BYTES', 1000)  # the logits of 128 images: 3 chunks
    assert study_main(argv(tmp_path, image_folder, '--save-logits', script='airbench94',
                           flags=training())) == 0
    record = records(tmp_path)[('baseline', 0)]
    outputs = outputs_of(tmp_path, 'baseline', 0)
    labels = load_study_data('folder', image_folder)['test']['labels']
    assert record['accuracy_on'] == 'test' and 'train_mask' not in outputs
    assert accuracy_of(outputs['logits'], labels) == record['test_acc'] == record['accuracy']
    monkeypatch.setattr(distribute, 'MAX_OUTPUT_BYTES', 1000)
    capsys.readouterr()
    assert study_main(argv(tmp_path / 'other', image_folder, '--save-logits')) == 1
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith('error: the outputs of a run would be 0 MiB (fp16 logits of 128 test '
                           'images x 4 classes, twice, and the subset mask), more than the 0 MiB')
    assert not (tmp_path / 'other').exists()


SCRIPTS_HERE = sorted(os.path.basename(path)[:-3] for path in glob.glob(f'{REPO}/airbench*.py'))
AFTER = 'flags of the scripts go after --: study.py SCRIPT --runs N --study-dir DIR -- '
HELP = "study.py's flags are in python study.py --help; the scripts' go after --"
BAD_INPUT = [  # study.py's flags (EMPTY: a .py file without a method), the script's, the message
    (['airbench93'], [], f"unknown script 'airbench93'; the scripts in {REPO} are "
     f"{', '.join(SCRIPTS_HERE)} (or give the path of a .py file)"),
    (['airbench94', '--runs', '0'], [], '--runs must be at least 1, not 0'),
    (['airbench94', '--config', 'a', '--config', 'a', 'opt.lr=1'], [],
     'configuration names must differ; used more than once: a'),
    (['airbench94', '--config', 'a', 'opt.learning_rate=1'], [],
     '--config a: no hyperparameter opt.learning_rate (opt has train_epochs, batch_size,'),
    (['airbench94', '--config', 'a', 'aug.flip=sideways'], [],
     "--config a: --hyp aug.flip takes one of ('alternating', 'random', 'none'), not 'sideways'"),
    (['airbench94', '--config', 'opt.lr=1'], [],
     '--config opt.lr=1: a configuration starts with its NAME'),
    (['airbench94', '--config', 'mine', 'nowhere/copy.py'], [], 'nowhere/copy.py: no such file'),
    (['airbench94', '--config', 'mine', 'EMPTY'], [],
     'lacks hyp, HYP_CHOICES, HYP_RANGES, train, build_net'),
    (['airbench94', '--grid', 'opt.learning_rate=1,2'], [], 'no hyperparameter opt.learning_rate'),
    (['airbench94', '--grid', 'aug.flip=random,sideways'], [],
     "--hyp aug.flip takes one of ('alternating'"),
    (['airbench94', '--grid', 'opt.lr=1,1'], [], '--grid opt.lr: a value is given twice'),
    (['airbench94', '--grid', 'opt.lr'], [], '--grid opt.lr: give KEY=V1,V2,...'),
    (['airbench94', '--grid', 'net.widths={1:2},3'], [], 'is not a number or a word'),
    (['airbench94', '--train-subset', '1.5'], [], '--train-subset is a fraction'),
    (['airbench94', '--vary', 'data'], [], "argument --vary: invalid choice: 'data'"),
    (['airbench94', '--val-split', '384'], [],
     '--val-split 384 leaves none of the 384 training images to train on'),
    (['airbench94'], ['--seed', '3'], '--seed after -- is for the script alone'),
    (['airbench94'], ['--epochs', '-1'],
     '--hyp opt.train_epochs takes a number from 0.001 to inf, not -1.0'),
    (['airbench94'], ['--hyp', 'opt.lr'], "'opt.lr' is not KEY=VALUE (for example opt.lr=10)"),
    (['airbench94'], ['--dataset', 'imagenet'],
     "the flags after -- are not valid: argument --dataset: invalid choice: 'imagenet'"),
    (['airbench94'], ['--device', 'toaster'], "--device 'toaster' is not a device"),
    (['airbench94'], ['--bogus'], 'the flags after -- are not valid: unrecognized arguments: '
     '--bogus'),
    (['airbench94'], ['--data-dir', '/nowhere'], '/nowhere is not in the image-folder layout'),
    # a script's flag before the separator: where it goes (one study.py refuses after -- too)
    *[(['airbench94', *flags], [], f'unrecognized arguments: {" ".join(flags)} ({hint})')
      for flags, hint in [(['--epochs', '5'], AFTER + '--epochs 5'),
                          (['--no-warmup'], AFTER + '--no-warmup'),
                          (['--epoch', '5', '--bogus'], HELP), (['--log-dir', 'logs'], HELP)]],
]


@pytest.mark.parametrize('args, script_flags, message', BAD_INPUT)
def test_bad_input_is_refused_in_one_line(args, script_flags, message, study_main, image_folder,
                                          tmp_path, capsys):
    empty = tmp_path / 'empty.py'
    empty.write_text('"""Not a script of the airbench kind."""\n')
    args = [str(empty) if arg == 'EMPTY' else arg for arg in args]
    runs = [] if '--runs' in args else ['--runs', '1']
    study_dir = tmp_path / 'study'
    assert study_main([*args, *runs, '--study-dir', str(study_dir), '--', *training(),
                       '--data-dir', image_folder, *script_flags]) == 1
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith('error: ') and message in line
    assert not study_dir.exists()  # refused before anything was written


@pytest.mark.parametrize('make, message', [
    (lambda path: path.write_text('not a directory'), '--study-dir {path} is a file, not a '
     'directory; give a directory (new or holding this study)'),
    (lambda path: path.mkdir() or (path / 'study.json').write_text('{"configs": [["a", "b"]]}'),
     '{path}/study.json was not written by this study.py (no settings, configs and runs); '
     'continue it with the study.py that made it, or use another --study-dir')],
    ids=['a file', 'another study.json'])
def test_a_study_dir_that_holds_something_else_is_refused_in_one_line(
        make, message, study_main, image_folder, tmp_path, capsys):
    path = tmp_path / 'study'
    make(path)
    assert study_main(argv(path, image_folder)) == 1
    assert capsys.readouterr().err.splitlines() == ['error: ' + message.format(path=path)]


@pytest.mark.slow
def test_a_refusal_after_the_heartbeat_started_ends_the_process_in_one_line(tmp_path):
    """As a process (the heartbeat thread stopped, or the interpreter aborts at exit)."""
    missing = finish(launch('airbench94', '--runs', '1', '--study-dir', str(tmp_path / 'study'),
                            '--', *training(), '--data-dir', str(tmp_path / 'nothing')))
    assert missing.returncode == 1 and missing.stderr.startswith('error: ')
    assert 'not in the image-folder layout' in missing.stderr and missing.stderr.count('\n') == 1


def test_a_study_directory_holds_one_study_which_later_launches_extend(
        study_main, image_folder, tmp_path, capsys):
    """A launch that changes a configuration, gives fewer runs or finds the study running is
    refused, nothing touched; one with more runs, or new configurations, trains only those."""
    def study(runs, *configs, epochs=1, names=('a', 'b')):
        names = [word for name in names for word in ('--config', name)]
        return study_main(argv(tmp_path, image_folder, *names, *configs, runs=runs,
                               flags=[*STAND_IN_FLAGS, '--epochs', str(epochs)]))

    assert study(2, 'curve.c=0.05') == 0
    before = record_files(tmp_path)
    capsys.readouterr()
    assert study(2, 'curve.c=0.06') == 1
    error = capsys.readouterr().err
    assert error.startswith(f'error: {tmp_path}: it holds another study: ')
    assert 'configs.b.hyp.curve.c (0.05 there, 0.06 here)' in error
    assert 'configs.b.overrides' in error and 'configs.a' not in error
    assert study(2, 'curve.c=0.05', epochs=2) == 1
    error = capsys.readouterr().err
    assert 'configs.a.hyp.opt.train_epochs (1.0 there, 2.0 here)' in error
    assert 'configs.b.hyp.opt.train_epochs (1.0 there, 2.0 here)' in error
    assert study(1, 'curve.c=0.05') == 1
    assert f'{tmp_path}: it holds this study with --runs 2; --runs 1 would leave runs out: give ' \
           '--runs 2 to continue it, or more to extend it' in capsys.readouterr().err
    with open(tmp_path / 'study.lock', 'w') as lock:  # as a launch running on DIR holds it
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        assert study(3, 'curve.c=0.05') == 1
    assert f'error: another launch is running the study in {tmp_path}' in capsys.readouterr().err
    assert record_files(tmp_path) == before  # nothing finished lost or touched

    assert study(3, 'curve.c=0.05') == 0  # a larger --runs extends the study: only the new runs
    assert sorted(trained(capsys.readouterr().out)) == [('a', 2), ('b', 2)]
    assert study(3, 'curve.c=0.07', '--grid', 'opt.train_epochs=1,2', names=['c']) == 0
    assert sorted(trained(capsys.readouterr().out)) == [
        (f'c,train_epochs={epochs}', run) for epochs in (1, 2) for run in range(3)]
    after = record_files(tmp_path)
    assert {path: after[path] for path in before} == before
    saved = json.load(open(tmp_path / 'study.json'))
    assert list(saved['configs']) == ['a', 'b', 'c,train_epochs=1', 'c,train_epochs=2']
    assert saved['runs'] == 3 and len(saved['commands']) == len(saved['launches']) == 3
    assert study_summary(tmp_path)['configs']['b']['n'] == 3  # the summary covers the whole study


def test_a_grid_expands_every_configuration_into_configs_that_study_json_keeps(
        study_main, image_folder, tmp_path):
    """Every combination of the grids, named legibly and safely as a directory; one Config from
    the command line to study.json and back (its script's hash and hyp added)."""
    configs = ['--config', 'alt', '--config', 'rnd', 'aug.flip=random', '--grid',
               'opt.train_epochs=5,10', '--grid', 'net.tta_level=0,2']
    args = cli.parse_args([STAND_IN, '--runs', '1', '--study-dir', str(tmp_path), *configs])
    assert list(args.configs) == [
        f'{name},train_epochs={epochs},tta_level={tta}' for name in ('alt', 'rnd')
        for epochs in (5, 10) for tta in (0, 2)]
    made = args.configs['rnd,train_epochs=10,tta_level=0']
    assert made == Config(name='rnd,train_epochs=10,tta_level=0', script=STAND_IN,
                          overrides=['aug.flip=random', 'opt.train_epochs=10', 'net.tta_level=0'],
                          base='rnd', grid={'opt.train_epochs': '10', 'net.tta_level': '0'})
    alone = cli.parse_args(['airbench94', '--runs', '1', '--study-dir', 'x',
                            '--grid', 'opt.lr=1,2', '--grid', 'aug.lr=3'])  # two leaves 'lr'
    assert list(alone.configs) == ['opt.lr=1,aug.lr=3', 'opt.lr=2,aug.lr=3']
    for name in [*args.configs, *alone.configs]:  # legible and safe as directory names
        assert '/' not in name and ' ' not in name and name == name.strip('.')
    assert study_main(argv(tmp_path, image_folder, *configs)) == 0
    stored = Study.read(str(tmp_path)).configs
    assert list(stored) == list(args.configs)
    config = stored['rnd,train_epochs=10,tta_level=0']
    assert config == Config(**{**vars(made), 'script_sha256': config.script_sha256,
                               'hyp': config.hyp})
    assert config.hyp['opt']['train_epochs'] == 10 and config.hyp['net']['tta_level'] == 0
    assert config.hyp['aug']['flip'] == 'random' and len(config.script_sha256) == 64


def test_configurations_of_two_scripts_are_paired_and_each_warmed_up_before_timing(
        study_main, image_folder, tmp_path, monkeypatch):
    """The stand-in and a copy outside the repository with another hyp: run i has the same seeds
    in each; each script is warmed up once (on dummy data), whatever its epochs, before any run."""
    copy = tmp_path / 'experiments' / 'mine.py'
    copy.parent.mkdir()
    copy.write_text(open(STAND_IN).read().replace("'c': 0.04,", "'c': 0.05,"))
    trains = []  # (script, dummy data or not) of every train() call, in order
    load = studylib.scripts.load_script

    def load_recording(path):
        module = load(path)
        train = module.train

        def recording(data, *args, **kwargs):
            trains.append((os.path.basename(path), len(data['train']['labels']) != 384))
            return train(data, *args, **kwargs)
        module.train = recording
        return module
    monkeypatch.setattr(studylib.scripts, 'load_script', load_recording)
    study_dir = tmp_path / 'study'
    assert study_main(argv(study_dir, image_folder, '--config', 'ours', '--config', 'mine',
                           str(copy), '--grid', 'opt.train_epochs=1,2', runs=2,
                           flags=[*STAND_IN_FLAGS, '--warmup'])) == 0
    identity = json.load(open(study_dir / 'study.json'))['configs']
    assert identity['mine,train_epochs=1']['script'] == str(copy)
    assert identity['mine,train_epochs=1']['hyp']['curve']['c'] == 0.05
    assert identity['ours,train_epochs=1']['hyp']['curve']['c'] == 0.04
    found = records(study_dir)
    assert len(found) == 8 and found[('mine,train_epochs=1', 0)]['script'] == str(copy)
    for run in range(2):  # run i: the same seeds whatever the script
        seeds = {repr(record['seeds']) for (_, i), record in found.items() if i == run}
        assert len(seeds) == 1
    assert found[('mine,train_epochs=1', 0)]['accuracy'] < found[('ours,train_epochs=1', 0)][
        'accuracy']  # the copy's own hyp: 1 point more error
    first_run = next(i for i, (_, dummy) in enumerate(trains) if not dummy)
    assert sorted(trains[:first_run]) == [('mine.py', True), ('stand_in_script.py', True)]
    assert not any(dummy for _, dummy in trains[first_run:])


def test_the_flags_after_the_separator_then_the_overrides_set_hyp_in_that_order():
    """The script's hyp, --epochs N, each --hyp, then the overrides: a later one wins."""
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


AFTER_SEPARATOR = ['--dataset', '--data-dir', '--train-splits', '--device', '--precision',
                   '--epochs', '--hyp', '--no-epoch-eval', '--no-warmup', '--deterministic']


@pytest.mark.parametrize('argv', [['--help'], ['airbench94', '--runs', '1', '--study-dir', 'DIR',
                                               '--', '--help']])
def test_the_help_shows_every_flag_after_the_separator_with_its_help(argv, capsys):
    """study.py --help, below its own flags; SCRIPT ... -- --help, those alone."""
    with pytest.raises(SystemExit) as exit:
        cli.parse_args(argv)
    assert exit.value.code == 0
    text = ' '.join(capsys.readouterr().out.split())
    after = text.partition('The flags after --')[2] if argv == ['--help'] else text
    for flag in AFTER_SEPARATOR:
        assert re.search(rf'{flag}\b[^-]*? [a-z]{{4,}}', after), flag


def test_each_warmup_is_recorded_once_per_script_and_hyp_and_reported(study_main, image_folder,
                                                                       tmp_path):
    """compiles/LAUNCH.json holds a CompileRecord per (script, hyp) warmed up, epochs aside (c
    trains a's network), and report.md's launches give what each cost."""
    study_dir = tmp_path / 'study'
    assert study_main(argv(study_dir, image_folder, '--config', 'a', '--config', 'b',
                           'aug.flip=random', '--config', 'c', 'opt.train_epochs=5',
                           flags=[*STAND_IN_FLAGS, '--warmup'])) == 0
    (path,) = glob.glob(os.path.join(study_dir, 'compiles', '*.json'))
    found = [CompileRecord.from_json(entry) for entry in json.load(open(path))]
    assert sorted((record.config, record.stage) for record in found) == [('a', 'warmup'),
                                                                         ('b', 'warmup')]
    assert all(record.came_from() == 'eager' and record.seconds > 0 for record in found)
    report = open(study_dir / 'report.md').read()
    assert '| a | warmup | 1 |' in report and '| b | warmup | 1 |' in report


def test_load_study_is_the_records_and_report_rebuilds_without_training(
        study_main, image_folder, tmp_path):
    assert study_main(argv(tmp_path, image_folder, '--save-logits', '--config', 'base',
                           '--config', 'random', 'aug.flip=random', runs=2)) == 0
    runs, arrays = study.load_study(str(tmp_path))
    found = records(tmp_path)
    assert len(runs) == len(found) == 4
    for _, row in runs.iterrows():
        record = found[(row['config'], row['run'])]
        for key in ('accuracy', 'total_time_seconds', 'steps', 'host', 'device_model', 'launch'):
            assert row[key] == record[key]
        assert [row[f'seed_{s}'] for s in SOURCES] == list(record['seeds'].values())
        assert row['aug.flip'] == ('random' if row['config'] == 'random' else 'alternating')
        logits = arrays['logits'][(row['config'], row['run'])]
        assert (logits.argmax(1) == arrays['test_labels']).mean() == \
            pytest.approx(record['test_acc'])
    assert list(zip(runs['config'], runs['run'])) == [('base', 0), ('base', 1), ('random', 0),
                                                      ('random', 1)]  # the study's order
    assert list(pd.read_csv(tmp_path / 'runs.csv')['accuracy']) == list(runs['accuracy'])
    summary_before = json.load(open(tmp_path / 'summary.json'))
    for name in ('summary.json', 'report.md', 'runs.csv'):
        os.remove(tmp_path / name)
    assert study_main(['report', str(tmp_path), '--variance']) == 0
    assert json.load(open(tmp_path / 'summary.json'))['configs'] == summary_before['configs']
    assert '## Variance and calibration' in open(tmp_path / 'report.md').read()
