"""A study directory damaged on disk. Reading a record is checking it: what cannot be read is
never counted, is set aside (kept) and its run trained again with the same seeds; every outcome
has its exit status (docs/studies.md, "Exit statuses")."""
import builtins
import errno
import json
import os
import pathlib
import re
import resource
import shutil
import signal
import subprocess
import sys

import numpy as np
import pytest
import torch

from conftest import REPO, write_image_folder
from test_report import add_run, config, make_study
from test_study import (ENV, STAND_IN_FLAGS, STUDY, argv, image_folder, records,  # noqa: F401
                        study_main, study_summary)

import study  # noqa: E402
import studylib.report  # noqa: E402
from studylib import errors, files, tables  # noqa: E402
from studylib.stats import variance  # noqa: E402

VOLATILE = ('started', 'finished', 'launch')  # what a run trained again changes in its record


def launch_argv(study_dir, data_dir, runs=3):
    return argv(study_dir, data_dir, '--save-logits', runs=runs,
                flags=[*STAND_IN_FLAGS, '--hyp', 'curve.noise=0.03'])


@pytest.fixture(scope='module')
def pristine_study(tmp_path_factory, image_folder):
    """A finished study of the stand-in (3 runs with saved logits, its report without plots),
    launched once for the module."""
    study_dir = tmp_path_factory.mktemp('damage') / 'study'
    with pytest.MonkeyPatch.context() as patch:
        for key in ('RANK', 'WORLD_SIZE', 'LOCAL_RANK'):
            patch.delenv(key, raising=False)
        patch.setattr(studylib.report, 'plot', lambda *args: None)
        assert study.main(launch_argv(study_dir, image_folder)) == 0
    return study_dir


@pytest.fixture
def finished_study(pristine_study, tmp_path, capsys):
    """A copy of the pristine study for one test to damage, and its records."""
    study_dir = tmp_path / 'study'
    shutil.copytree(pristine_study, study_dir)
    capsys.readouterr()
    return study_dir, records(study_dir)


def cut_short(path, keep=0.5):
    content = path.read_bytes()
    path.write_bytes(content[:int(len(content) * keep)])


def rewrite_record(path, change):
    record = json.loads(path.read_text())
    change(record)
    path.write_text(json.dumps(record))


DAMAGE = {
    'cut short': ('unreadable', lambda run_dir: cut_short(run_dir / '00001.json')),
    'empty': ('unreadable', lambda run_dir: (run_dir / '00001.json').write_text('')),
    'an older format, lacking a field': ('unreadable', lambda run_dir: rewrite_record(
        run_dir / '00001.json', lambda record: record.pop('accuracy'))),
    'a newer format, with a field unknown here': ('unreadable', lambda run_dir: rewrite_record(
        run_dir / '00001.json', lambda record: record.update(accuracy_top5=0.99))),
    'an accuracy that is not one': ('unreadable', lambda run_dir: rewrite_record(
        run_dir / '00001.json', lambda record: record.update(accuracy=93.75))),
    "another run's record in its place": ('misplaced', lambda run_dir: rewrite_record(
        run_dir / '00001.json', lambda record: record.update(run=2))),
    'its saved outputs cut short': ('outputs-unreadable',
                                    lambda run_dir: cut_short(run_dir / '00001.pt')),
}


@pytest.mark.parametrize('damage', DAMAGE)
def test_a_damaged_run_is_not_counted_set_aside_and_trained_again_with_its_seeds(
        damage, finished_study, study_main, image_folder, capsys):
    study_dir, before = finished_study
    run_dir = study_dir / 'runs' / 'baseline'
    why, make = DAMAGE[damage]
    make(run_dir)
    damaged = {name: (run_dir / name).read_bytes() for name in ('00001.json', '00001.pt')}

    # The report alone reads the same way: the run is not counted, and the report says why
    assert study_main(['report', str(study_dir)]) == 0
    summary = study_summary(study_dir)
    assert summary['runs_finished'] == 2 and summary['status'] == 'partial'
    assert summary['configs']['baseline']['n'] == 2
    (line,) = summary['damaged']
    assert line.startswith(f'runs/baseline/00001.json ({why}: ')
    assert f'- {line}' in (study_dir / 'report.md').read_text()
    assert capsys.readouterr().err.splitlines() == [f'warning: damaged, not counted: {line}']

    # The launch sets it aside, says so in one line, and trains that run again
    assert study_main(launch_argv(study_dir, image_folder)) == 0
    (note,) = [line for line in capsys.readouterr().out.splitlines() if 'set aside' in line]
    assert note.startswith(f'set aside 1 damaged file of {study_dir}, not counted and kept in '
                           f'{study_dir}/set_aside (2 moved): runs/baseline/00001.json ({why}: ')
    kept = study_dir / 'set_aside' / 'baseline'
    assert {name: (kept / f'{name}.{why}').read_bytes() for name in damaged} == damaged
    after = records(study_dir)
    assert sorted(after) == sorted(before)
    for key in before:  # the same seeds give the stand-in's same run
        assert {k: v for k, v in after[key].items() if k not in VOLATILE} == \
            {k: v for k, v in before[key].items() if k not in VOLATILE}
    assert after[('baseline', 1)]['finished'] != before[('baseline', 1)]['finished']
    assert study_summary(study_dir)['status'] == 'complete'
    assert study_summary(study_dir)['damaged'] == []


def ghost_directory(study_dir):
    stray = study_dir / 'runs' / 'ghost'
    stray.mkdir()
    shutil.copy(study_dir / 'runs' / 'baseline' / '00000.json', stray)


@pytest.mark.parametrize('make, said, kept', [
    # records that would count for a later configuration of that name, whatever its hyp: a record
    # names its configuration, not what the configuration was
    (ghost_directory, 'runs/ghost (no-configuration: study.json has no configuration ghost)',
     'ghost.no-configuration/00000.json'),
    (lambda study_dir: (study_dir / 'runs' / 'baseline' / '00002.failed.json').write_text(
        '{"failures": ['), 'runs/baseline/00002.failed.json (unreadable: not JSON: ',
     'baseline/00002.failed.json.unreadable')], ids=['a directory no configuration names',
                                                     'a record of failed tries cut short'])
def test_what_is_no_run_is_not_counted_and_set_aside(make, said, kept, finished_study,
                                                     study_main, image_folder, capsys):
    study_dir, before = finished_study
    make(study_dir)
    assert study_main(['report', str(study_dir)]) == 0
    summary = study_summary(study_dir)
    assert (summary['runs_finished'], summary['runs_failed']) == (3, 0)
    assert study_main(launch_argv(study_dir, image_folder)) == 0
    (note,) = [line for line in capsys.readouterr().out.splitlines() if 'set aside' in line]
    assert said in note and (study_dir / 'set_aside' / kept).exists()
    assert records(study_dir) == before  # nothing trained again
    assert not [path for path in (study_dir / 'runs').rglob('*') if 'ghost' in str(path) or
                path.name.endswith('.failed.json')]


def test_a_study_json_cut_short_is_read_from_its_copy_and_refused_without_one(
        finished_study, study_main, image_folder, capsys):
    study_dir, _ = finished_study
    cut_short(study_dir / 'study.json')
    damaged = (study_dir / 'study.json').read_bytes()
    assert study_main(['report', str(study_dir)]) == 0
    assert study_summary(study_dir)['damaged'][0].startswith(
        f'study.json ({study_dir}/study.json is unreadable (not JSON: ')
    capsys.readouterr()
    assert study_main(launch_argv(study_dir, image_folder, runs=4)) == 0  # and extended
    out = capsys.readouterr().out
    assert f'{study_dir}/study.json is unreadable (not JSON: ' in out
    assert 'the study was read from its copy study.backup.json; the damaged file is kept as ' \
           'set_aside/study.json.unreadable' in out
    assert (study_dir / 'set_aside' / 'study.json.unreadable').read_bytes() == damaged
    study = json.loads((study_dir / 'study.json').read_text())
    assert study == json.loads((study_dir / 'study.backup.json').read_text())
    assert study['runs'] == 4 and len(study['launches']) == 2
    before = records(study_dir)
    assert len(before) == 4

    for name in ('study.json', 'study.backup.json'):  # the copy too: refused, records kept
        cut_short(study_dir / name)
    for command in (launch_argv(study_dir, image_folder, runs=4), ['report', str(study_dir)]):
        assert study_main(command) == errors.StudyError.exit_status
        (line,) = capsys.readouterr().err.splitlines()
        assert line.startswith(f'error: {study_dir}/study.backup.json is unreadable (not JSON: ')
        assert line.endswith('study.json is unreadable too: restore one of them from a copy of '
                             'your own, or use another --study-dir')
    (study_dir / 'study.backup.json').unlink()
    assert study_main(launch_argv(study_dir, image_folder, runs=4)) == 1
    assert 'it has no copy' in capsys.readouterr().err
    assert records(study_dir) == before


class FullDisk:
    """A file on a disk that fills: half of what is written reaches it, then ENOSPC."""

    def __init__(self, file):
        self.file = file

    def __enter__(self):
        return self

    def __exit__(self, *exception):
        self.file.close()

    def write(self, content):
        self.file.write(content[:len(content) // 2])
        self.file.flush()
        raise OSError(errno.ENOSPC, 'No space left on device')


def test_a_disk_that_fills_while_a_record_is_written_leaves_no_run_and_says_so(
        study_main, image_folder, tmp_path, monkeypatch, capsys):
    study_dir = tmp_path / 'study'

    def open_on_a_full_disk(path, mode='r', *args, **kwargs):
        file = builtins.open(path, mode, *args, **kwargs)
        return FullDisk(file) if 'w' in mode and re.search(r'/runs/.*\.json', str(path)) else file

    monkeypatch.setattr(files, 'open', open_on_a_full_disk, raising=False)
    assert study_main(launch_argv(study_dir, image_folder)) == errors.StorageError.exit_status
    error = capsys.readouterr().err.splitlines()[-1]
    assert error == (f'error: {study_dir}/runs/baseline/00000.json could not be written (No space '
                     'left on device); nothing half-written was kept: free space on its disk (or '
                     'fix its permissions), then run the same command again')
    assert not [name for name in os.listdir(study_dir / 'runs' / 'baseline')
                if name.endswith('.json') or '.tmp' in name]
    monkeypatch.undo()  # space is freed: the same command trains every run
    assert study_main(launch_argv(study_dir, image_folder)) == 0
    assert len(records(study_dir)) == 3


@pytest.mark.slow
def test_a_file_size_limit_while_outputs_are_written(tmp_path):
    """The operating system's own refusal (RLIMIT_FSIZE: writes past the limit fail with EFBIG,
    as they do with ENOSPC on a full disk), in a process of its own: the outputs of 2,000 test
    images (16 KiB of fp16 logits each time) exceed the limit that study.json and records fit
    in, so the first run's outputs cannot be written, and no record says it finished."""
    folder = write_image_folder(str(tmp_path / 'data'), num_classes=2, train_per_class=64,
                                test_per_class=1000)
    study_dir = tmp_path / 'study'

    def limit_file_size():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG for the write, not a killed process
        resource.setrlimit(resource.RLIMIT_FSIZE, (12 << 10, 12 << 10))

    command = [sys.executable, STUDY, *launch_argv(study_dir, folder, runs=2)]
    result = subprocess.run(command, capture_output=True, text=True, env=ENV, timeout=300,
                            preexec_fn=limit_file_size)
    assert result.returncode == errors.StorageError.exit_status, result.stderr[-2000:]
    assert result.stderr.splitlines()[-1].startswith(
        f'error: {study_dir}/runs/baseline/00000.pt could not be written (File too large); nothing '
        'half-written was kept')
    assert records(study_dir) == {} and not list((study_dir / 'runs').rglob('*.tmp*'))
    again = subprocess.run(command, capture_output=True, text=True, env=ENV, timeout=300)
    assert again.returncode == 0 and len(records(study_dir)) == 2


def test_a_run_trained_again_replaces_its_votes_in_the_kept_tally(tmp_path):
    """The variance analysis keeps its tallies between reports; a run whose record was set aside
    and trained again (another finish time) must not keep its old votes."""
    study_dir = str(tmp_path / 'study')
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 10, 200)
    make_study(study_dir, {'a': config('a')}, 3, save_logits=True)
    with open(os.path.join(study_dir, 'test_labels.json'), 'w') as f:
        json.dump(labels.tolist(), f)

    def logits():
        return {'logits': torch.randn(200, 10).half(), 'logits_plain': torch.randn(200, 10).half()}
    outputs = {run: logits() for run in range(3)}
    for run in range(3):
        add_run(study_dir, 'a', run, 0.5, outputs=outputs[run])
    runs, _ = tables.load_study(study_dir, outputs=False)
    labels_read = tables.test_labels(study_dir)
    tables.ensemble_tallies(study_dir, runs, labels_read, 10)  # kept in DIR/analysis
    outputs[1] = logits()
    add_run(study_dir, 'a', 1, 0.5, outputs=outputs[1])
    record_path = os.path.join(study_dir, 'runs', 'a', '00001.json')
    rewrite_record(pathlib.Path(record_path),
                   lambda record: record.update(finished='2026-11-27T00:00:00'))
    runs, _ = tables.load_study(study_dir, outputs=False)
    tally = tables.ensemble_tallies(study_dir, runs, labels_read, 10)['a']['tta']
    fresh = variance.EnsembleTally(labels, 10)
    for run in range(3):
        fresh.add(outputs[run]['logits'].float().numpy().argmax(axis=1))
    assert np.array_equal(tally.votes, fresh.votes)


def test_the_exit_statuses_in_the_docs_are_the_engines():
    text = open(os.path.join(REPO, 'docs', 'studies.md')).read()
    table = text.partition('## Exit statuses')[2]
    statuses = {int(status) for status in re.findall(r'^\| (\d+) \|', table, re.MULTILINE)}
    engine = {error.exit_status for error in (errors.StudyError, errors.RunsFailed,
                                              errors.ReportFailed, errors.StorageError)}
    assert statuses == {0, *engine, 130, 143}
