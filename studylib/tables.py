"""A study's records as a pandas table, one row per run; its saved outputs read one run at a time
(never all at once: 10,000 runs of fp16 logits are about 4 GB); and the ensemble tallies of the
variance and calibration analyses, kept beside the study and extended by the runs added since."""
import io
import os
from collections.abc import Mapping

import numpy as np
import pandas as pd
import torch

from .config import Study
from .errors import StudyError
from .files import StudyDir, atomic_write, failure_files, read_failures, read_json, scan_runs
from .stats.variance import EnsembleTally

OUTPUT_KEYS = ('logits', 'logits_plain', 'train_mask')
TALLY_KEYS = {'tta': 'logits', 'no_tta': 'logits_plain'}


def read_study(study_dir):
    study = Study.read(study_dir)
    if study is None:
        raise StudyError(f'{study_dir} holds no study (no study.json); give the --study-dir of one')
    return study


def flatten(mapping, prefix=''):
    """{'opt': {'lr': 1}} as {'opt.lr': 1}, to any depth."""
    flat = {}
    for key, value in mapping.items():
        if isinstance(value, dict):
            flat.update(flatten(value, f'{prefix}{key}.'))
        else:
            flat[f'{prefix}{key}'] = value
    return flat


def record_row(record, config):
    row = {key: value for key, value in record.items() if key != 'seeds'}
    row.update({f'seed_{source}': seed for source, seed in record.get('seeds', {}).items()})
    row.update(base=config.base, script_sha256=config.script_sha256)
    row.update({f'grid.{key}': value for key, value in config.grid.items()})
    row.update(flatten(config.hyp))
    return row


def load_records(study_dir, study):
    """(records, damaged): the finished runs' records as files.scan_runs reads and checks them,
    and a line for each damaged file left out (the next launch sets it aside, trains its run)."""
    finished, damaged = scan_runs(study_dir, study)
    copy = [f'study.json ({study.damaged}; the study was read from its copy, '
            'study.backup.json)'] if study.damaged else []
    return [record.to_json() for record in finished.values()], \
        copy + [entry.line() for entry in damaged]


def failed_runs(study_dir, study):
    """{config: [RUN.failed.json of each run]} of the runs that failed and are not finished (a
    damaged file is left out: load_records names it)."""
    failed = {}
    for config in study.configs:
        for path in failure_files(study_dir, config):
            try:
                failed.setdefault(config, []).append(read_failures(path))
            except ValueError:
                continue
    return failed


def read_outputs(study_dir, config, run):
    """A run's saved outputs as numpy arrays ({'logits': fp16 (test images, classes), ...}), or {}
    when it saved none."""
    path = StudyDir(study_dir).outputs(config, run)
    if not os.path.exists(path):
        return {}
    return {key: value.numpy() for key, value in torch.load(path, weights_only=True).items()}


class SavedOutputs(Mapping):
    """{(config, run): array} of one kind of saved output (logits, logits_plain, train_mask), read
    from its file when looked up, in the dtype it was saved in (fp16 logits): a study's outputs
    are never all in memory. runs: the runs that saved this kind (their settings say so)."""

    def __init__(self, study_dir, key, runs):
        self.study_dir = study_dir
        self.key = key
        self.runs = list(runs)
        self.index = set(self.runs)

    def __getitem__(self, run):
        if run not in self.index:
            raise KeyError(run)
        return read_outputs(self.study_dir, *run)[self.key]

    def __iter__(self):
        return iter(self.runs)

    def __len__(self):
        return len(self.runs)


def load_study(study_dir, outputs=True):
    """(runs, arrays): runs is a pandas DataFrame, one row per finished run (configuration, script
    and its SHA-256, every hyp key as a column such as 'opt.lr', the grid point, seeds, accuracies,
    time, steps, device model, host, launch ...); arrays maps each kind of saved output to a
    SavedOutputs ({(config, run): array} read on lookup: 'logits' and 'logits_plain' fp16 (test
    images, classes), 'train_mask') and holds 'test_labels' (an int array, when logits were
    saved). runs.attrs['damaged']: a line for each damaged file that is left out."""
    study = read_study(study_dir)
    records, damaged = load_records(study_dir, study)
    rows = [record_row(record, study.configs[record['config']]) for record in records]
    runs = pd.DataFrame(rows)
    if len(runs):
        runs = runs.sort_values(['config', 'run'], key=lambda column: column.map(
            list(study.configs).index) if column.name == 'config' else column,
            ignore_index=True)
    runs.attrs['damaged'] = damaged
    arrays = {}
    if outputs:
        settings = study.settings
        saved = {'logits': settings.get('save_logits'), 'logits_plain': settings.get('save_logits'),
                 'train_mask': settings.get('train_subset') is not None}
        finished = [(record['config'], record['run']) for record in records]
        arrays = {key: SavedOutputs(study_dir, key, finished if saved[key] else [])
                  for key in OUTPUT_KEYS}
        labels = test_labels(study_dir)
        if labels is not None:
            arrays['test_labels'] = labels
    return runs, arrays


def test_labels(study_dir):
    path = StudyDir(study_dir).test_labels()
    if not os.path.exists(path):
        return None
    return np.array(read_json(path, 'rerun a launch to rewrite it'))


def ensemble_tallies(study_dir, runs, labels, num_classes):
    """{config: {'tta': EnsembleTally, 'no_tta': EnsembleTally}} over the finished runs with saved
    logits, diverged runs left out. Each is kept in DIR/analysis/ and extended by the runs finished
    since (a launch's report reads only the logits it added); one with a run gone is rebuilt."""
    tallies = {}
    for config, group in runs.groupby('config', sort=False) if len(runs) else ():
        group = group[~group['diverged'].fillna(False).astype(bool)] if 'diverged' in group \
            else group
        wanted = {int(run): str(stamp) for run, stamp in zip(group['run'], group['finished'])
                  if os.path.exists(StudyDir(study_dir).outputs(config, int(run)))}
        if wanted:
            tallies[config] = {name: _tally(study_dir, config, wanted, key, labels, num_classes)
                               for name, key in TALLY_KEYS.items()}
    return tallies


def _tally(study_dir, config, wanted, key, labels, num_classes):
    """The tally of the runs in wanted ({run: its record's finished time}): the kept one where
    each run it holds is still that run (a run trained again, after its record was set aside,
    has another time), extended by the others."""
    path = StudyDir(study_dir).tally(config, key)
    tally = EnsembleTally(labels, num_classes)
    held = []
    if os.path.exists(path):
        try:
            with np.load(path) as saved:
                kept = dict(zip(saved['runs'].tolist(), saved['finished'].tolist()))
                if all(wanted.get(run) == stamp for run, stamp in kept.items()) and \
                        saved['votes'].shape == tally.votes.shape:
                    tally.votes[:] = saved['votes']
                    tally.accuracies = saved['accuracies'].tolist()
                    held = list(kept)
        except (OSError, ValueError, KeyError):
            pass  # an unreadable tally, or one of an earlier format, is rebuilt from the logits
    new = sorted(set(wanted) - set(held))
    for run in new:
        tally.add(read_outputs(study_dir, config, run)[key].argmax(axis=1))
    if new:
        runs = held + new
        os.makedirs(os.path.dirname(path), exist_ok=True)
        buffer = io.BytesIO()
        np.savez(buffer, votes=tally.votes, accuracies=np.array(tally.accuracies),
                 runs=np.array(runs), finished=np.array([wanted[run] for run in runs]))
        atomic_write(path, buffer.getvalue())
    return tally
