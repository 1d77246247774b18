"""study.py: every run of every configuration trained exactly once across processes and
machines, resumption after kill -9 and after a lost machine, seeds per source, training subsets,
held-out validation and saved logits, the statistics against scipy's, and bad input refused."""
import fcntl
import glob
import json
import math
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import time

import pytest
import torch
from scipy import stats

from conftest import (REPO, descendants, free_port, load_script, torchrun, torchrun_worker,
                      write_image_folder)

STUDY = os.path.join(REPO, 'study.py')
ENV = {**{key: value for key, value in os.environ.items()
          if key not in ('RANK', 'WORLD_SIZE', 'LOCAL_RANK')}, 'OMP_NUM_THREADS': '1'}
SOURCES = ('init', 'order', 'aug')


def training(width=16, epochs=1, warmup=False):
    """The script's flags for a tiny training on the synthetic folder: one epoch of batches of 32
    of a network of this width (0.3 s per run at width 16 on one CPU core, about 1 s at 32 and 2
    epochs); epochs=None leaves the epochs to the configurations."""
    widths = {'block1': width, 'block2': width, 'block3': width}
    return ['--dataset', 'folder', '--hyp', 'opt.batch_size=32', '--hyp', f'net.widths={widths}',
            *(['--epochs', str(epochs)] if epochs else []), '--device', 'cpu',
            '--precision', 'fp32', '--no-epoch-eval', '--warmup' if warmup else '--no-warmup']


def records(study_dir):
    """{(config, run): record} of the finished runs (not the tries of failed ones)."""
    return {(r['config'], r['run']): r for r in
            (json.load(open(path)) for path in glob.glob(f'{study_dir}/runs/*/*.json')
             if not path.endswith('.failed.json'))}


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


@pytest.fixture
def study_main(monkeypatch):
    """study.main in this process, on a script module the test may instrument."""
    import study
    import studylib.scripts
    for key in ('RANK', 'WORLD_SIZE', 'LOCAL_RANK'):
        monkeypatch.delenv(key, raising=False)

    def main(argv, script=None):
        if script is not None:
            monkeypatch.setattr(studylib.scripts, 'load_script', lambda path: script)
        return study.main(argv)
    return main


@pytest.mark.slow
def test_two_processes_train_every_run_once_and_the_summary_is_scipys(image_folder, tmp_path):
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

    summary = study_summary(study_dir)
    assert summary['status'] == 'complete' and summary['runs_finished'] == 8
    accuracies = {c: [found[(c, run)]['accuracy'] for run in range(4)] for c in ('base', 'lr5')}
    for config, values in accuracies.items():
        entry = summary['configs'][config]
        n = len(values)
        mean = statistics.fmean(values)
        std = statistics.stdev(values)
        half_width = stats.t.ppf(0.975, n - 1) * std / math.sqrt(n)
        t_above = (mean - 0.5) / (std / math.sqrt(n))
        times = [found[(config, run)]['total_time_seconds'] for run in range(4)]
        assert entry['n'] == n and entry['mean'] == pytest.approx(mean)
        assert entry['std'] == pytest.approx(std)
        assert [entry['ci_low'], entry['ci_high']] == pytest.approx([mean - half_width,
                                                                     mean + half_width])
        # the p-value of "mean <= target" over every run, its one-sided bound, and Holm's
        # decision at 5% over the two configurations' claims
        claim = summary['target_claims']['claims'][config]
        assert claim['p_value'] == pytest.approx(stats.t.sf(t_above, n - 1))
        assert claim['p_value'] == pytest.approx(
            stats.ttest_1samp(values, 0.5, alternative='greater').pvalue)
        assert claim['lower_bound'] == pytest.approx(mean - stats.t.ppf(0.95, n - 1) * std
                                                     / math.sqrt(n))
        assert claim['above_target'] == (claim['p_holm'] < 0.05)
        (cpu_times,) = entry['time_by_device'].values()
        assert cpu_times['mean'] == pytest.approx(statistics.fmean(times)) and cpu_times['n'] == 4
    (comparison,) = summary['comparisons']['comparisons']
    ours = accuracies['lr5']
    theirs = accuracies['base']
    difference = statistics.fmean(ours) - statistics.fmean(theirs)
    variances = [statistics.variance(ours) / 4, statistics.variance(theirs) / 4]
    dof = sum(variances)**2 / sum(v**2 / 3 for v in variances)  # Welch-Satterthwaite
    half_width = stats.t.ppf(0.975, dof) * math.sqrt(sum(variances))
    paired = [a - b for a, b in zip(ours, theirs)]
    t_paired = statistics.fmean(paired) / (statistics.stdev(paired) / 2)
    # the runs share their seeds: the paired t-test is the study's, Welch's in summary.json only
    assert comparison['config'] == 'lr5' and comparison['baseline'] == 'base'
    assert comparison['test'] == 'paired t-test' and comparison['n_a'] == 4
    assert comparison['difference'] == pytest.approx(difference)
    assert comparison['p_value'] == pytest.approx(stats.ttest_rel(ours, theirs).pvalue)
    assert comparison['p_value'] == pytest.approx(2 * stats.t.sf(abs(t_paired), 3))
    paired_half_width = stats.t.ppf(0.975, 3) * statistics.stdev(paired) / 2
    assert [comparison['ci_low'], comparison['ci_high']] == pytest.approx(
        [difference - paired_half_width, difference + paired_half_width])
    welch = comparison['other_test']
    assert [welch['ci_low'], welch['ci_high']] == pytest.approx([difference - half_width,
                                                                 difference + half_width])
    assert welch['p_value'] == pytest.approx(
        stats.ttest_ind(ours, theirs, equal_var=False).pvalue)
    assert welch['p_value'] == pytest.approx(
        2 * stats.t.sf(abs(difference) / math.sqrt(sum(variances)), dof))

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


@pytest.mark.slow
@pytest.mark.parametrize('rank', [1, 0])
def test_kill_9_of_a_worker_then_the_same_command_completes_the_study(rank, image_folder,
                                                                       tmp_path):
    study_dir = tmp_path / 'study'
    args = ['airbench94', '--runs', '8', '--study-dir', str(study_dir), '--',
            *training(width=32, epochs=2), '--data-dir', image_folder]
    first = launch(*args, launcher=['--nproc_per_node=2', f'--master-port={free_port()}'])
    wait_for(lambda: len(records(study_dir)) >= 2)
    os.kill(torchrun_worker(first.pid, rank), signal.SIGKILL)  # mid-run, no chance to clean up
    first = finish(first)  # torchrun stops the other process
    assert first.returncode != 0
    assert len(set(trained(first.stdout))) == len(trained(first.stdout))
    before = record_files(study_dir)
    finished = sorted(records(study_dir))
    assert 2 <= len(finished) < 8, 'the study must be stopped part-way for this test'
    if rank == 1:  # rank 0 lives on to write a partial summary and say so
        assert 'the same command continues the study' in first.stderr
        assert study_summary(study_dir)['status'] == 'partial'

    second = finish(launch(*args, launcher=['--nproc_per_node=2', f'--master-port={free_port()}']))
    assert second.returncode == 0, second.stderr[-3000:]
    every_run = [('baseline', run) for run in range(8)]
    assert sorted(records(study_dir)) == every_run
    assert sorted(trained(second.stdout)) == sorted(set(every_run) - set(finished))  # once each
    after = record_files(study_dir)
    assert {path: after[path] for path in before} == before  # finished runs byte for byte
    assert study_summary(study_dir)['configs']['baseline']['n'] == 8


def two_node_launch(node, port, study_dir, data_dir, *flags, **options):
    """One "machine" of a two-node study on localhost: node-rank 0 or 1 at one rendezvous."""
    return launch('airbench94', '--study-dir', str(study_dir), *flags, '--data-dir', data_dir,
                  launcher=['--nnodes=2', f'--node-rank={node}', '--nproc_per_node=1',
                            f'--rdzv-endpoint=127.0.0.1:{port}'], **options)


@pytest.mark.slow
def test_two_nodes_on_localhost_complete_one_study(tmp_path):
    # each machine with its own copy of the data and no shared filesystem: only rank 0 writes DIR
    data_dirs = [write_image_folder(str(tmp_path / f'data{node}')) for node in (0, 1)]
    study_dirs = [tmp_path / f'study{node}' for node in (0, 1)]
    port = free_port()
    flags = ['--runs', '6', '--', *training()]
    nodes = [two_node_launch(node, port, study_dirs[node], data_dirs[node], *flags)
             for node in (0, 1)]
    node0, node1 = [finish(node) for node in nodes]
    assert (node0.returncode, node1.returncode) == (0, 0), node0.stderr[-3000:]
    found = records(study_dirs[0])
    assert sorted(found) == [('baseline', run) for run in range(6)]
    assert sorted(trained(node0.stdout)) == sorted(found) and trained(node1.stdout) == []
    assert {record['rank'] for record in found.values()} == {0, 1}
    assert not study_dirs[1].exists()
    assert study_summary(study_dirs[0])['launches'][0]['environment']['world_size'] == 2


@pytest.mark.slow
def test_a_lost_machine_has_its_run_trained_by_another_in_the_same_launch(image_folder, tmp_path):
    study_dir = tmp_path / 'study'
    port = free_port()
    flags = ['--runs', '6', '--lost-after', '2', '--', *training(width=32, epochs=2)]
    node0 = two_node_launch(0, port, study_dir, image_folder, *flags)
    node1 = two_node_launch(1, port, tmp_path / 'elsewhere', image_folder, *flags)
    wait_for(lambda: any(record['rank'] == 1 for record in records(study_dir).values()))
    for pid in [*descendants(node1.pid), node1.pid]:  # the whole machine, mid-run
        os.kill(pid, signal.SIGKILL)
    node1.communicate()
    # the study completes without node 1: its unfinished run goes back to the queue once its
    # heartbeat has been silent for --lost-after seconds (torchrun on node 0 then waits for the
    # lost node's agent at its exit barrier: that is torchrun's, so the test stops it)
    wait_for(lambda: os.path.exists(study_dir / 'summary.json') and
             study_summary(study_dir)['status'] == 'complete', timeout=180)
    node0.terminate()
    output = finish(node0)
    every_run = [('baseline', run) for run in range(6)]
    assert sorted(records(study_dir)) == every_run
    assert sorted(trained(output.stdout)) == every_run  # each written once


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


@pytest.mark.parametrize('vary', ['order', 'init', 'aug'])
def test_varying_one_source_holds_the_others(vary, study_main, image_folder, tmp_path):
    script = load_script('airbench94')
    initial_states = []
    reinitialize = script.reinitialize

    def recording_reinitialize(net, *switches):  # what train() starts from, after seeding the init
        reinitialize(net, *switches)
        initial_states.append({k: v.clone() for k, v in net.state_dict().items()})

    script.reinitialize = recording_reinitialize
    study_dir = tmp_path / 'study'
    assert study_main(['airbench94', '--runs', '2', '--seed', '7', '--vary', vary, '--study-dir',
                       str(study_dir), '--', *training(), '--data-dir', image_folder],
                      script) == 0
    found = records(study_dir)
    for run in range(2):
        assert found[('baseline', run)]['seeds'] == {
            source: script.source_seeds(7 + run if source == vary else 7)[source]
            for source in SOURCES}
    first, second = initial_states[-2:]  # runs 0 and 1, in order, in one process
    same_init = all(torch.equal(first[key], second[key]) for key in first)
    assert same_init == (vary != 'init')
    losses = [found[('baseline', run)]['epoch_train_losses'] for run in range(2)]
    assert losses[0] != losses[1]  # the varied source did change the training


def test_a_subset_trains_on_its_masked_images_and_validation_is_held_out(
        study_main, image_folder, tmp_path):
    script = load_script('airbench94')
    calls = []
    train = script.train

    def recording_train(data, *args, **kwargs):
        result = train(data, *args, **kwargs)
        calls.append(dict(train=data['train'], evaluated=data['test'],
                          accuracy=result['tta_val_acc']))
        return result

    script.train = recording_train
    study_dir = tmp_path / 'study'
    assert study_main(['airbench94', '--runs', '2', '--study-dir', str(study_dir), '--save-logits',
                       '--train-subset', '0.5', '--val-split', '64', '--',
                       *training(), '--data-dir', image_folder], script) == 0
    data = script.load_dataset(image_folder)
    images = data['train']['images']
    labels = data['train']['labels']
    held_out = json.load(open(study_dir / 'validation.json'))['indices']
    assert len(set(held_out)) == 64 and max(held_out) < len(labels)
    masks = []
    for run, call in enumerate(calls):  # no warmup: one train() per run
        record = records(study_dir)[('baseline', run)]
        outputs = torch.load(study_dir / 'runs' / 'baseline' / f'{run:05d}.pt')
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
        accuracy = (logits.argmax(1) == data['test']['labels']).float().mean().item()
        assert accuracy == record['test_acc']
    assert not torch.equal(masks[0], masks[1])  # each run its own subset
    assert study_summary(study_dir)['accuracy_on'] == 'validation'


def test_saved_logits_reproduce_the_test_accuracy(study_main, image_folder, tmp_path):
    study_dir = tmp_path / 'study'
    assert study_main(['airbench94', '--runs', '1', '--study-dir', str(study_dir),
                       '--save-logits', '--', *training(), '--data-dir', image_folder]) == 0
    record = records(study_dir)[('baseline', 0)]
    outputs = torch.load(study_dir / 'runs' / 'baseline' / '00000.pt')
    test_labels = load_script('airbench94').load_dataset(image_folder)['test']['labels']
    accuracy = (outputs['logits'].argmax(1) == test_labels).float().mean().item()
    assert record['accuracy_on'] == 'test' and accuracy == record['test_acc']
    assert record['test_acc'] == record['accuracy']  # the same as train()'s, on the CPU
    assert 'train_mask' not in outputs


BAD_INPUT = [  # study.py's flags, the script's (after the tiny training's), the message
    (['airbench93'], [], "unknown script 'airbench93'; the scripts in"),
    (['airbench94', '--runs', '0'], [], '--runs must be at least 1, not 0'),
    (['airbench94', '--config', 'a', '--config', 'a', 'opt.lr=1'], [],
     'configuration names must differ; used more than once: a'),
    (['airbench94', '--config', 'a', 'opt.learning_rate=1'], [],
     '--config a: no hyperparameter opt.learning_rate (opt has train_epochs, batch_size,'),
    (['airbench94', '--config', 'a', 'aug.flip=sideways'], [],
     "--config a: --hyp aug.flip takes one of ('alternating', 'random', 'none'), not 'sideways'"),
    (['airbench94', '--config', 'opt.lr=1'], [],
     '--config opt.lr=1: a configuration starts with its NAME'),
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
]


@pytest.mark.parametrize('args, script_flags, message', BAD_INPUT)
def test_bad_input_is_refused_in_one_line(args, script_flags, message, study_main, image_folder,
                                          tmp_path, capsys):
    study_dir = tmp_path / 'study'
    runs = [] if '--runs' in args else ['--runs', '1']
    assert study_main([*args, *runs, '--study-dir', str(study_dir), '--', *training(),
                       '--data-dir', image_folder, *script_flags]) == 1
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith('error: ') and message in line
    assert not study_dir.exists()  # refused before anything was written


@pytest.mark.slow
def test_missing_data_and_an_unknown_script_from_the_command_line(tmp_path):
    missing = finish(launch('airbench94', '--runs', '1', '--study-dir', str(tmp_path / 'study'),
                            '--', *training(), '--data-dir', str(tmp_path / 'nothing')))
    assert missing.returncode == 1 and 'Traceback' not in missing.stderr
    assert missing.stderr.startswith('error: ')
    assert 'not in the image-folder layout' in missing.stderr and missing.stderr.count('\n') == 1
    unknown = finish(launch('airbench9', '--runs', '1', '--study-dir', str(tmp_path / 'study')))
    assert unknown.returncode == 1 and unknown.stderr.count('\n') == 1
    assert "error: unknown script 'airbench9'; the scripts in" in unknown.stderr
    found = sorted(os.path.basename(path)[:-3] for path in glob.glob(f'{REPO}/airbench*.py'))
    assert f"are {', '.join(found)} (or give the path of a .py file)\n" in unknown.stderr
    assert 'airbench94_compiled' in found


def test_a_study_directory_holds_one_study_which_a_larger_runs_extends(
        study_main, image_folder, tmp_path, capsys):
    study_dir = tmp_path / 'study'

    def study(runs, *configs, epochs=1):
        return study_main(['airbench94', '--runs', str(runs), '--study-dir', str(study_dir),
                           '--config', 'a', '--config', 'b', *configs, '--',
                           *training(epochs=epochs), '--data-dir', image_folder])

    assert study(2, 'opt.lr=5') == 0
    before = record_files(study_dir)
    capsys.readouterr()
    assert study(2, 'opt.lr=6') == 1
    error = capsys.readouterr().err
    assert error.startswith(f'error: {study_dir}: it holds another study: ')
    assert 'configs.b.hyp.opt.lr (5 there, 6 here)' in error
    assert 'configs.b.overrides' in error and 'configs.a' not in error
    assert study(2, 'opt.lr=5', epochs=2) == 1
    error = capsys.readouterr().err
    assert 'configs.a.hyp.opt.train_epochs (1.0 there, 2.0 here)' in error
    assert 'configs.b.hyp.opt.train_epochs (1.0 there, 2.0 here)' in error
    assert study(1, 'opt.lr=5') == 1
    assert f'{study_dir}: it holds this study with --runs 2; --runs 1 would leave runs out: give ' \
           '--runs 2 to continue it, or more to extend it' in capsys.readouterr().err
    with open(study_dir / 'study.lock', 'w') as lock:  # as a launch running on DIR holds it
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        assert study(3, 'opt.lr=5') == 1
    assert f'error: another launch is running the study in {study_dir}' in capsys.readouterr().err
    assert record_files(study_dir) == before  # nothing finished lost or touched

    assert study(3, 'opt.lr=5') == 0  # a larger --runs extends the study: only the new runs
    assert sorted(trained(capsys.readouterr().out)) == [('a', 2), ('b', 2)]
    after = record_files(study_dir)
    assert {path: after[path] for path in before} == before
    assert study_summary(study_dir)['configs']['b']['n'] == 3
    assert json.load(open(study_dir / 'study.json'))['runs'] == 3
