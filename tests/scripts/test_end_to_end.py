"""The scripts run as a user runs them: as subprocesses, on a small image-folder dataset."""
import json
import os

import pytest
import torch

from conftest import (ALL_SCRIPTS, QUICK, REPO, SCRIPTS, load_script, narrow, run_script, study_dir,
                      summary_of, tiny_dataset, warm_up_as_on_cuda)


# Each script as a whole (their networks differ). Two runs check the study's bookkeeping (seed + i,
# per-run entries, the summary over runs), which is the same code in every script
# (tests/scripts/test_layout.py), so the others do one run to keep the suite short.
RUNS = {'airbench94': 2}


@pytest.mark.slow
@pytest.mark.parametrize('name', SCRIPTS)
def test_run_writes_logs_and_learns(name, image_folder, tmp_path):
    log_dir = tmp_path / 'logs'
    runs = RUNS.get(name, 1)
    result = run_script(name, '--data-dir', image_folder, '--runs', str(runs), '--seed', '3',
                        '--log-dir', str(log_dir), *QUICK)
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
    assert all(len(r['epoch_train_losses']) == 4 for r in summary['runs'])
    # Four classes: chance is 0.25; the synthetic classes are easy, so demand far more
    assert min(accuracies) > 0.6 and all(t > 0 for t in times)
    if runs > 1:  # the statistics over the runs, in the log and on the screen
        stats = summary['tta_val_acc']
        assert stats['n'] == runs and stats['mean'] == pytest.approx(sum(accuracies) / runs)
        assert stats['ci95'][0] <= stats['mean'] <= stats['ci95'][1]
        assert f"{stats['mean']:.4f}" in result.stdout
    assert summary['warmup_seconds'] >= 0  # the time left, said after the first epoch:
    assert f'minutes left for the {runs} runs' in result.stdout


@pytest.mark.parametrize('name', ALL_SCRIPTS)
def test_help_lists_every_flag(name, capsys):
    with pytest.raises(SystemExit) as exit:
        load_script(name).main(['--help'])
    assert exit.value.code == 0
    usage = capsys.readouterr().out
    for flag in ['--runs', '--data-dir', '--device', '--seed', '--log-dir', '--epochs',
                 '--precision', '--hyp', '--warmup']:
        assert flag in usage
    for flag in ['--dataset', '--train-splits', '--epoch-eval', '--deterministic']:
        assert flag not in usage  # study.py's, after its --


@pytest.mark.parametrize('full', [False, True])
def test_the_warmup_warms_what_the_device_needs(ab94, tmp_path, monkeypatch, full):
    """On a CPU (nothing compiles) two steps and a test set of two batches; on CUDA (full, forced
    here) through the whitening bias's freeze (3 epochs, so 4, cut to the run's 2) and the whole
    test set, for the graphs and kernels of the real shapes. Random labels, untimed."""
    monkeypatch.setattr(ab94, 'load_dataset', lambda *a, **k: tiny_dataset(per_class=64))
    if full:
        warm_up_as_on_cuda(monkeypatch, ab94, [])
    calls, labels, train = [], [], ab94.train

    def recorded(data, hyp, *args, **kwargs):
        calls.append((len(data['train']['labels']), len(data['test']['labels']),
                      hyp['opt']['train_epochs']))
        labels.append(data['train']['labels'].clone())
        return train(data, hyp, *args, **kwargs)
    monkeypatch.setattr(ab94, 'train', recorded)
    assert ab94.main(['--runs', '1', '--log-dir', str(tmp_path), '--device', 'cpu', '--epochs',
                      '2', '--hyp', 'opt.batch_size=16', '--hyp', 'net.tta_level=0',
                      *narrow('airbench94')]) == 0
    assert calls == [(32, 128 if full else 32, 2 if full else 1), (128, 128, 2)]
    assert not torch.equal(labels[0], labels[1][:32])  # the warmup's labels are random
    assert summary_of(tmp_path)['warmup_seconds'] > 0
    assert ab94.hyp['opt']['whiten_bias_epochs'] == 3
