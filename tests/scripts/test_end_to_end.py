"""The scripts run as a user runs them: as subprocesses, on a small image-folder dataset."""
import json
import math
import os
import re
import statistics
import types

import pytest
import torch

from conftest import (ALL_SCRIPTS, QUICK, QUICK_HYP, REPO, run_script, set_hyp, study_dir,
                      summary_of, tiny_dataset, tiny_hyp, warm_up_as_on_cuda)

# Two runs check the runner's bookkeeping (seed + i, the summary over runs), the same code in every
# script (test_layout.py): the others do one
RUNS = {'airbench94': 2}
HYP = {'airbench96_faster': {'net.widths': {'block1': 16, 'block2': 16, 'block3': 16}}}


@pytest.mark.slow
@pytest.mark.parametrize('name', ALL_SCRIPTS)
def test_run_writes_logs_and_learns(name, image_folder, tmp_path):
    log_dir = tmp_path / 'logs'
    runs = RUNS.get(name, 1)
    result = run_script(name, '--data-dir', image_folder, '--runs', str(runs), '--seed', '3',
                        '--log-dir', str(log_dir), *QUICK, hyp={**QUICK_HYP, **HYP.get(name, {})})
    assert result.returncode == 0, result.stderr
    run_dir = study_dir(log_dir)
    assert f'Log: {run_dir}' in result.stdout
    summary = json.loads((run_dir / 'summary.json').read_text())
    assert summary['code'] == open(os.path.join(REPO, f'{name}.py')).read()
    assert summary['hyp']['opt']['train_epochs'] == 4 and summary['hyp']['opt']['batch_size'] == 64
    assert summary['device'] == 'cpu' and summary['torch_version'] == torch.__version__
    assert [r['seed'] for r in summary['runs']] == [3, 4][:runs] and summary['base_seed'] == 3
    assert summary['status'] == 'finished' and summary['runs_finished'] == runs
    accuracies = [r['tta_val_acc'] for r in summary['runs']]
    times = [r['total_time_seconds'] for r in summary['runs']]
    # 384 images in batches of 64; four easy classes, chance 0.25
    assert all(r['steps'] == 24 and len(r['epoch_train_losses']) == 4 for r in summary['runs'])
    assert min(accuracies) > 0.6 and all(t > 0 for t in times)
    if runs > 1:  # the mean and std over the runs, in the log and on the screen (no interval)
        stats = summary['tta_val_acc']
        assert stats['n'] == runs and stats['mean'] == pytest.approx(sum(accuracies) / runs)
        assert stats['std'] == pytest.approx(statistics.stdev(accuracies)) and 'ci95' not in stats
        assert f"tta_val_acc: mean {stats['mean']:.4f}  std {stats['std']:.4f}  n 2" in \
            result.stdout
    assert summary['warmup_seconds'] >= 0  # the time left, said after run 0 where runs follow
    said = re.search(r'about \d+(\.\d)? (seconds|minutes) left for 1 more run', result.stdout)
    assert bool(said) == (runs > 1), result.stdout


def test_help_lists_every_flag_and_where_the_others_are(ab94, capsys):
    with pytest.raises(SystemExit) as exit:
        ab94.main(['--help'])
    assert exit.value.code == 0
    usage = capsys.readouterr().out
    flags = re.findall(r'^  (--[a-z-]+)', usage, re.MULTILINE)
    assert flags == ['--runs', '--seed', '--epochs', '--data-dir', '--device', '--log-dir']
    assert 'edit hyp' in usage and 'study.py' in usage


def test_the_time_left_counts_the_whole_first_run(ab94, tmp_path, monkeypatch, capsys):
    """Run 0's wall time, TTA included, times the runs left; minutes from 90 seconds on. Each epoch
    takes 60 s and each TTA 20 s of a stand-in clock (the per-epoch figures count the epochs)."""
    monkeypatch.setattr(ab94, 'load_dataset', lambda *a, **k: tiny_dataset())
    clock = [0.0]
    monkeypatch.setattr(ab94, 'time', types.SimpleNamespace(perf_counter=lambda: clock[0]))

    def train_taking_a_minute_an_epoch(data, hyp, device, precision, seed, *args, **kwargs):
        on_epoch = kwargs.pop('on_epoch', None)
        for epoch in range(math.ceil(hyp['opt']['train_epochs'])):
            clock[0] += 60
            if on_epoch is not None:
                on_epoch(dict(epoch=epoch, train_loss=1.0, total_time_seconds=60.0 * (epoch + 1)))
        clock[0] += 20
        return dict(seed=seed, tta_val_acc=0.5, total_time_seconds=60.0)
    monkeypatch.setattr(ab94, 'train', train_taking_a_minute_an_epoch)
    set_hyp(monkeypatch, ab94, tiny_hyp('airbench94'), {'opt.batch_size': 16})
    said = {}
    for runs, epochs in ((1, 2), (2, 1), (3, 1), (2, 2)):
        ab94.main(['--runs', str(runs), '--epochs', str(epochs), '--log-dir', str(tmp_path)])
        said[runs, epochs] = [line for line in capsys.readouterr().out.splitlines()
                              if ' left for ' in line]
    assert said == {(1, 2): [], (2, 1): ['about 80 seconds left for 1 more run'],
                    (3, 1): ['about 2.7 minutes left for 2 more runs'],
                    (2, 2): ['about 2.3 minutes left for 1 more run']}


@pytest.mark.parametrize('full', [False, True])
def test_the_warmup_warms_what_the_device_needs(ab94, tmp_path, monkeypatch, full):
    """On a CPU two steps and a test set of two batches; on CUDA (full) the real shapes: through
    the whitening bias's freeze (3 epochs, cut to the run's 2) and the whole test set."""
    monkeypatch.setattr(ab94, 'load_dataset', lambda *a, **k: tiny_dataset())
    if full:
        warm_up_as_on_cuda(monkeypatch, ab94, [])
    calls = []
    labels = []
    train = ab94.train

    def recorded(data, hyp, *args, **kwargs):
        calls.append((len(data['train']['labels']), len(data['test']['labels']),
                      hyp['opt']['train_epochs']))
        labels.append(data['train']['labels'].clone())
        return train(data, hyp, *args, **kwargs)
    monkeypatch.setattr(ab94, 'train', recorded)
    set_hyp(monkeypatch, ab94, tiny_hyp('airbench94'), {'opt.batch_size': 16, 'net.tta_level': 0})
    assert ab94.main(['--runs', '1', '--log-dir', str(tmp_path), '--device', 'cpu', '--epochs',
                      '2']) == 0
    assert calls == [(32, 64 if full else 32, 2 if full else 1), (64, 64, 2)]
    assert not torch.equal(labels[0], labels[1][:32])  # the warmup's labels are random
    assert summary_of(tmp_path)['warmup_seconds'] > 0
    assert ab94.hyp['opt']['whiten_bias_epochs'] == 3


@pytest.mark.parametrize('native_bf16', [True, False])
def test_the_precision_for_a_device_is_the_scripts_and_study_pys(ab94, monkeypatch, native_bf16):
    """One choice, the tail's precision_for, which study.py's --precision auto calls."""
    from studylib.device import resolve_device_precision
    monkeypatch.setattr(torch.ops.mkldnn, '_is_mkldnn_bf16_supported', lambda: native_bf16)
    assert ab94.precision_for(torch.device('cuda', 0)) == 'fp16'
    assert ab94.precision_for(torch.device('cpu')) == ('bf16' if native_bf16 else 'fp32')
    assert resolve_device_precision('cpu', 'auto') == (torch.device('cpu'),
                                                       'bf16' if native_bf16 else 'fp32')
    assert resolve_device_precision('cpu', 'fp32')[1] == 'fp32'  # study.py's choice, when given
