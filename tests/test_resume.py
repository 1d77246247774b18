"""Interrupted runs and studies continue exactly where they stopped (--resume, checkpoints)."""
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
import torch

from conftest import REPO, tiny_dataset
from test_end_to_end import QUICK, run_script

CPU = torch.device('cpu')


def small_hyp(script, epochs):
    return {**script.hyp, 'opt': {**script.hyp['opt'], 'batch_size': 32, 'train_epochs': epochs},
            'net': {**script.hyp['net'], 'tta_level': 2}}


def test_a_resumed_run_is_bitwise_the_uninterrupted_run(script, tmp_path):
    """Checkpoint after epoch 1 of 4 (whitening bias still trained, Lookahead's first update
    still ahead, alternating flips and translation in use), resume it into a fresh network: the
    later epochs' losses, the final weights and the TTA accuracy are identical."""
    data, hyp = tiny_dataset(), small_hyp(script, 4)
    path, kept = tmp_path / 'checkpoint.pt', tmp_path / 'after_epoch_1.pt'

    def keep_epoch_1_checkpoint(line):
        if line.split('|')[2].strip() == '2':  # logged before epoch 2's checkpoint replaces epoch 1's
            shutil.copy(path, kept)

    whole = script.train(0, data, hyp, CPU, 'fp32', seed=7, epoch_eval=False,
                         log=keep_epoch_1_checkpoint, checkpoint_path=str(path))
    checkpoint = torch.load(kept, weights_only=False)
    assert (checkpoint['run'], checkpoint['seed'], checkpoint['epoch']) == (0, 7, 1)
    resumed = script.train(0, data, hyp, CPU, 'fp32', seed=7, epoch_eval=False,
                           log=lambda line: None, resume=checkpoint)
    assert resumed['resumed_after_epoch'] == 1 and whole['resumed_after_epoch'] is None
    assert resumed['epoch_train_losses'] == whole['epoch_train_losses']
    assert resumed['steps'] == whole['steps'] == 8
    assert resumed['tta_val_acc'] == whole['tta_val_acc']
    for name, tensor in whole['net'].state_dict().items():
        assert torch.equal(resumed['net'].state_dict()[name], tensor), name
    assert resumed['time_seconds'] > checkpoint['time_seconds']


def test_resuming_after_the_last_epoch_only_runs_tta(ab94, tmp_path):
    data, hyp = tiny_dataset(), small_hyp(ab94, 2)
    path = tmp_path / 'checkpoint.pt'
    whole = ab94.train(0, data, hyp, CPU, 'fp32', seed=1, epoch_eval=False, log=lambda line: None,
                       checkpoint_path=str(path))
    checkpoint = torch.load(path, weights_only=False)
    assert checkpoint['epoch'] == 1 and checkpoint['step'] == whole['steps']
    resumed = ab94.train(0, data, hyp, CPU, 'fp32', seed=1, epoch_eval=False, log=lambda line: None,
                         resume=checkpoint)
    assert resumed['tta_val_acc'] == whole['tta_val_acc']
    assert resumed['epoch_train_losses'] == whole['epoch_train_losses']


def read_checkpoint(path):
    try:
        return torch.load(path, weights_only=False)
    except (FileNotFoundError, RuntimeError, EOFError):
        return None


def test_a_killed_study_resumes_to_the_same_results(image_folder, tmp_path):
    """SIGKILL (no chance to clean up, as when a machine is reclaimed) in the middle of the first
    of two runs; --resume finishes the study with exactly the uninterrupted study's results."""
    flags = ['--data-dir', image_folder, '--runs', '2', '--seed', '11', *QUICK, '--epochs', '8']
    reference = run_script('airbench94', *flags, '--log-dir', str(tmp_path / 'whole'))
    assert reference.returncode == 0, reference.stderr
    (whole_dir,) = list((tmp_path / 'whole').iterdir())
    whole = torch.load(whole_dir / 'log.pt', weights_only=False)
    assert not (whole_dir / 'checkpoint.pt').exists()  # removed once the run is in the log

    logs = tmp_path / 'killed'
    process = subprocess.Popen([sys.executable, os.path.join(REPO, 'airbench94.py'), *flags,
                                '--log-dir', str(logs)], stdout=subprocess.PIPE, text=True)
    deadline, checkpoint = time.time() + 600, None
    while time.time() < deadline and process.poll() is None:
        dirs = list(logs.iterdir()) if logs.exists() else []
        checkpoint = read_checkpoint(dirs[0] / 'checkpoint.pt') if dirs else None
        if checkpoint is not None and checkpoint['run'] == 0 and checkpoint['epoch'] >= 1:
            break
        time.sleep(0.02)
    process.send_signal(signal.SIGKILL)
    process.communicate(timeout=60)
    assert checkpoint is not None and checkpoint['run'] == 0, 'the study ended before it was killed'
    (study_dir,) = list(logs.iterdir())
    assert torch.load(study_dir / 'log.pt', weights_only=False)['runs'] == []

    result = run_script('airbench94', '--resume', str(study_dir))
    assert result.returncode == 0, result.stderr
    assert 'Resuming: 0 of 2 runs finished; run 0 continues after epoch' in result.stdout
    resumed = torch.load(study_dir / 'log.pt', weights_only=False)
    assert resumed['status'] == 'finished' and resumed['argv'] == whole['argv'][:-2] + ['--log-dir', str(logs)]
    assert torch.equal(resumed['accs'], whole['accs'])
    assert [r['epoch_train_losses'] for r in resumed['runs']] == [r['epoch_train_losses'] for r in whole['runs']]
    assert resumed['runs'][0]['resumed_after_epoch'] >= 1 and resumed['runs'][1]['resumed_after_epoch'] is None
    assert not (study_dir / 'checkpoint.pt').exists()


def test_resume_refuses_a_directory_without_a_log(tmp_path):
    result = run_script('airbench94', '--resume', str(tmp_path))
    assert result.returncode == 1 and 'Traceback' not in result.stderr
    assert f'--resume {tmp_path}: there is no log.pt in it' in result.stderr


def test_resume_refuses_a_study_run_by_another_version_of_the_script(ab94, tmp_path):
    torch.save({'code': 'an older airbench94.py', 'argv': ['--runs', '1'], 'runs': []},
               tmp_path / 'log.pt')
    result = run_script('airbench94', '--resume', str(tmp_path))
    assert result.returncode == 1 and 'Traceback' not in result.stderr
    assert 'was run by another version of this script' in result.stderr
