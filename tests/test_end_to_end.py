"""The scripts run as a user runs them: as subprocesses, on a small image-folder dataset."""
import json
import os
import subprocess
import sys

import pytest
import torch

from conftest import REPO, SCRIPTS

# A quick schedule on the synthetic data: 384 training images in batches of 64 for 4 epochs
QUICK = ['--hyp', 'opt.batch_size=64', '--epochs', '4', '--device', 'cpu', '--no-warmup']


def run_script(name, *args, timeout=600):
    return subprocess.run([sys.executable, os.path.join(REPO, f'{name}.py'), *args],
                          capture_output=True, text=True, timeout=timeout)


# Two runs check the study's bookkeeping (seed + i, per-run entries, the summary over runs), which
# is a shared block, identical in all scripts (tests/test_method.py); the wider networks, at 3x
# (95) and 5x (96) airbench94's time per image, do one run to keep the suite short.
RUNS = {'airbench95': 1, 'airbench96': 1}


@pytest.mark.parametrize('name', SCRIPTS)
def test_run_writes_logs_and_learns(name, image_folder, tmp_path):
    log_dir = tmp_path / 'logs'
    runs = RUNS.get(name, 2)
    result = run_script(name, '--data-dir', image_folder, '--runs', str(runs), '--seed', '3',
                        '--log-dir', str(log_dir), *QUICK)
    assert result.returncode == 0, result.stderr
    (run_dir,) = list(log_dir.iterdir())
    assert f'Log: {run_dir}' in result.stdout
    log = torch.load(run_dir / 'log.pt', weights_only=False)
    summary = json.loads((run_dir / 'summary.json').read_text())
    assert log['code'] == open(os.path.join(REPO, f'{name}.py')).read()
    assert log['accs'].shape == (runs,) and log['times'].shape == (runs,)
    assert log['hyp']['opt']['train_epochs'] == 4 and log['hyp']['opt']['batch_size'] == 64
    assert log['device'] == 'cpu' and log['torch_version'] == torch.__version__
    assert [r['seed'] for r in log['runs']] == [3, 4][:runs]
    assert summary['status'] == 'finished' and summary['runs_finished'] == runs
    assert summary['tta_val_acc']['n'] == runs
    assert summary['tta_val_acc']['mean'] == pytest.approx(log['accs'].mean().item())
    # Four classes: chance is 0.25; the synthetic classes are easy, so demand far more
    assert log['accs'].min().item() > 0.6
    assert all(t > 0 for t in log['times'].tolist())
    # The per-epoch table and the summary lines
    accuracy_line = (f"TTA accuracy: {summary['tta_val_acc']['mean']:.4f} (n 1)" if runs == 1 else
                     f"TTA accuracy: mean {summary['tta_val_acc']['mean']:.4f}  std ")
    assert 'tta_val_acc' in result.stdout and accuracy_line in result.stdout
    assert result.stdout.count(' eval  |') == runs
    # The cache was written beside the images and the second start reads it
    assert os.path.exists(os.path.join(image_folder, 'airbench_cache.pt'))


@pytest.mark.parametrize('name', SCRIPTS)
def test_import_does_nothing_but_define(name):
    code = (f'import sys, importlib.util; sys.argv = ["x", "--runs", "0"]\n'
            f'spec = importlib.util.spec_from_file_location("m", {os.path.join(REPO, name + ".py")!r})\n'
            'm = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)\n'
            'assert callable(m.main)')
    result = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True,
                            cwd=REPO, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout == '' and result.stderr == ''


@pytest.mark.parametrize('name', SCRIPTS)
def test_help_lists_every_flag(name):
    result = run_script(name, '--help', timeout=120)
    assert result.returncode == 0
    for flag in ['--runs', '--data-dir', '--device', '--seed', '--log-dir', '--epochs',
                 '--precision', '--flip', '--tta-level', '--hyp', '--epoch-eval', '--warmup']:
        assert flag in result.stdout
