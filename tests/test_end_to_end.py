"""The scripts run as a user runs them: as subprocesses, on a small image-folder dataset."""
import json
import os

import pytest
import torch

from conftest import ALL_SCRIPTS, QUICK, REPO, SCRIPTS, load_script, run_script, study_dir


# Each script as a whole (their networks differ). Two runs check the study's bookkeeping (seed + i,
# per-run entries, the summary over runs), which is the same code in every script
# (tests/test_layout.py), so the others do one run to keep the suite short.
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
    log = torch.load(run_dir / 'log.pt', weights_only=False)
    summary = json.loads((run_dir / 'summary.json').read_text())
    assert log['code'] == open(os.path.join(REPO, f'{name}.py')).read()
    assert log['accs'].shape == (runs,) and log['times'].shape == (runs,)
    assert log['hyp']['opt']['train_epochs'] == 4 and log['hyp']['opt']['batch_size'] == 64
    assert log['device'] == 'cpu' and log['torch_version'] == torch.__version__
    assert [r['seed'] for r in log['runs']] == [3, 4][:runs] and summary['base_seed'] == 3
    assert summary['status'] == 'finished' and summary['runs_finished'] == runs
    assert summary['tta_val_acc']['n'] == runs
    assert summary['tta_val_acc']['mean'] == pytest.approx(log['accs'].mean().item())
    times = [r['total_time_seconds'] for r in summary['runs']]
    assert times == pytest.approx(log['times'].tolist())
    assert all(len(r['epoch_train_losses']) == 4 for r in summary['runs'])
    # Four classes: chance is 0.25; the synthetic classes are easy, so demand far more
    assert log['accs'].min().item() > 0.6
    assert all(t > 0 for t in log['times'].tolist())
    assert f"{summary['tta_val_acc']['mean']:.4f}" in result.stdout  # the mean is reported
    # The cache was written beside the images and the second start reads it
    assert os.path.exists(os.path.join(image_folder, 'airbench_cache.pt'))


@pytest.mark.parametrize('name', ALL_SCRIPTS)
def test_help_lists_every_flag(name, capsys):
    with pytest.raises(SystemExit) as exit:
        load_script(name).main(['--help'])
    assert exit.value.code == 0
    usage = capsys.readouterr().out
    for flag in ['--runs', '--dataset', '--data-dir', '--train-splits', '--device', '--seed',
                 '--log-dir', '--epochs', '--precision', '--hyp', '--epoch-eval', '--warmup',
                 '--deterministic']:
        assert flag in usage
