"""The paper's experiments in studies/: each runs its study with tiny trainings and
writes the paper-shaped table from the records, with the numbers of the records."""
import os
import re
import subprocess
import sys

import pytest

from conftest import REPO
from test_study import ENV, image_folder, training  # noqa: F401

sys.path.insert(0, os.path.join(REPO, 'studies'))
import study  # noqa: E402  (put on the path by studies/paper.py)


def run_experiment(name, study_dir, data_dir, *flags, epochs=1, script_flags=None, status=0):
    """studies/NAME.py as a user runs it, with the tiny training's flags (or script_flags): its
    paper_table.md (its process's stderr if it exits with another status than 0)."""
    command = [sys.executable, os.path.join(REPO, 'studies', f'{name}.py'),
               '--study-dir', str(study_dir), *flags, '--',
               *(script_flags or training(epochs=epochs)), '--data-dir', data_dir]
    result = subprocess.run(command, capture_output=True, text=True, env=ENV, timeout=600)
    assert result.returncode == status, result.stderr[-3000:]
    return open(os.path.join(study_dir, 'paper_table.md')).read() if status == 0 else \
        result.stderr


def percent(values):
    return f'{100 * sum(values) / len(values):.2f}%'


@pytest.mark.slow
def test_training_order_table(image_folder, tmp_path):
    table = run_experiment('training_order', tmp_path / 'order', image_folder, '--runs', '2')
    runs, _ = study.load_study(str(tmp_path / 'order'))
    assert sorted(set(runs['config'])) == ['replacement-alternating', 'replacement-random',
                                          'reshuffle-alternating', 'reshuffle-random']
    for config, reshuffled, alternating in (('replacement-random', 'No', 'No'),
                                            ('reshuffle-alternating', 'Yes', 'Yes')):
        mean = percent(list(runs.loc[runs['config'] == config, 'accuracy']))
        assert re.search(rf'\| {reshuffled} \| {alternating} \| {re.escape(mean)} ± ', table)
    assert set(runs.loc[runs['config'].str.startswith('replacement'), 'opt.sampling']) == {
        'replacement'}


@pytest.mark.slow
def test_alternating_flip_tables_with_both_tta_columns_and_speedups(image_folder, tmp_path):
    study_dir = tmp_path / 'flip'
    table = run_experiment('alternating_flip', study_dir, image_folder, '--runs', '2',
                           '--epochs', '1,2,3', '--cutout', 'no', '--flips', 'random,alternating',
                           script_flags=[f for f in training(epochs=None)
                                         if f != '--no-epoch-eval'])
    runs, _ = study.load_study(str(study_dir))
    assert len(runs) == 2 * 3 * 2
    at_2 = runs[runs['opt.train_epochs'] == 2]
    for metric, tta in (('val_acc', 'No'), ('accuracy', 'Yes')):
        cells = [f"{100 * at_2.loc[at_2['base'] == f'cutout-no-{flip}', metric].mean():.4f} (n 2)"
                 for flip in ('random', 'alternating')]
        assert f'| 2 | No | {tta} | {cells[0]} | {cells[1]} |' in table
    assert 'Effective speedup of alternating over random flip' in table
    assert len(re.findall(r'^\| No \| [123] \| ', table, re.MULTILINE)) == 3


@pytest.mark.slow
def test_alternating_flip_needs_the_plain_accuracy(image_folder, tmp_path):
    error = run_experiment('alternating_flip', tmp_path / 'flip', image_folder, '--runs', '1',
                           '--epochs', '1,2', '--cutout', 'no', '--flips', 'random', epochs=None,
                           status=1)
    assert error.strip().splitlines()[-1].startswith(
        'error: the runs have no plain (no-TTA) accuracy: per-epoch evaluation was off')


@pytest.mark.slow
def test_variance_table_from_saved_logits(image_folder, tmp_path):
    study_dir = tmp_path / 'variance'
    table = run_experiment('variance_calibration', study_dir, image_folder, '--runs', '3',
                           '--base-epochs', '1', '--base-widths', '8,16,16', epochs=None)
    summary = study.load_study(str(study_dir))
    runs = summary[0]
    assert sorted(set(runs['config'])) == ['epochs-1.5x-width-1.5x', 'epochs-1x', 'epochs-2x']
    # the configurations' widths and epochs override the tiny training's flags
    assert set(runs.loc[runs['config'] == 'epochs-1.5x-width-1.5x', 'net.widths.block2']) == {24}
    assert set(runs.loc[runs['config'] == 'epochs-2x', 'opt.train_epochs']) == {2}
    mean = percent(list(runs.loc[runs['config'] == 'epochs-2x', 'accuracy']))
    assert f'| 2x | 1x | Yes | 3 | {mean} |' in table
    assert len(re.findall(r'^\| [0-9.]+x \| [0-9.]+x \| (Yes|No) \| 3 \|', table,
                          re.MULTILINE)) == 6


@pytest.mark.slow
def test_additive_ablation_table_is_the_fits_of_the_records(image_folder, tmp_path):
    study_dir = tmp_path / 'ablation'
    table = run_experiment('additive_ablation', study_dir, image_folder, '--runs', '1',
                           '--epochs', '1,2,4', '--target', '0.9', epochs=None)
    runs, _ = study.load_study(str(study_dir))
    assert len(set(runs['base'])) == 12 and len(runs) == 36
    baseline = runs[runs['base'] == 'whitened-baseline']
    assert set(baseline['net.identity_init']) == {False} and set(baseline['aug.flip']) == {'random'}
    assert set(baseline['opt.lookahead_every']) == {0} and set(baseline['net.tta_level']) == {1}
    plus = runs[runs['base'] == 'baseline-plus-Lookahead']
    assert set(plus['opt.lookahead_every']) == {5} and set(plus['opt.bias_scaler']) == {1.0}
    assert len(re.findall(r'^\| (identity init|BatchNorm-bias lr x64|Lookahead|multi-crop TTA|'
                          r'alternating flip) \|', table, re.MULTILINE)) == 5
    curve = runs[runs['base'] == 'airbench94'].sort_values('opt.train_epochs')
    try:
        epochs = study.epochs_to_accuracy(list(curve['opt.train_epochs']), list(curve['accuracy']),
                                          0.9)
        expected = f'airbench94 {epochs:.1f} ['
    except ValueError:  # the tiny network's errors need not follow a power law
        expected = 'airbench94 no fit'
    assert expected in table
    assert open(study_dir / 'additive.png', 'rb').read(8) == b'\x89PNG\r\n\x1a\n'
