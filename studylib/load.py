"""A study's records as a pandas table, one row per run, and its saved outputs as arrays."""
import glob
import os

import numpy as np
import pandas as pd
import torch

from .errors import StudyError
from .plan import read_json

OUTPUT_KEYS = ('logits', 'logits_plain', 'train_mask')


def read_study(study_dir):
    path = os.path.join(study_dir, 'study.json')
    if not os.path.isfile(path):
        raise StudyError(f'{study_dir} holds no study (no study.json); give the --study-dir of one')
    study = read_json(path, 'restore it from a copy')
    if not isinstance(study.get('configs'), dict):
        raise StudyError(f'{path} was written by an older study.py; rebuild its report with that '
                         'version')
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
    """One row of the table: the record's fields, its seeds and its configuration's hyp."""
    row = {key: value for key, value in record.items() if key != 'seeds'}
    row.update({f'seed_{source}': seed for source, seed in record.get('seeds', {}).items()})
    row.update(base=config['base'], script_sha256=config['script_sha256'])
    row.update({f'grid.{key}': value for key, value in config['grid'].items()})
    row.update(flatten(config['hyp']))
    return row


def load_records(study_dir, study, suffix='.json'):
    """Every record of the study's configurations: of finished runs (RUN.json), or with suffix
    '.failed.json' the tries of runs that failed and have not been trained since."""
    records = []
    for config in study['configs']:
        for path in sorted(glob.glob(os.path.join(study_dir, 'runs', glob.escape(config),
                                                  f'[0-9]*{suffix}'))):
            if '.tmp' not in path and os.path.basename(path).count('.') == suffix.count('.'):
                records.append(read_json(path, 'remove it to train that run again'))
    return records


def failed_runs(study_dir, study):
    """{config: [the failure record of each try]} of the runs that failed and are not finished."""
    failed = {}
    for entry in load_records(study_dir, study, '.failed.json'):
        failed.setdefault(entry['config'], []).append(entry)
    return failed


def load_outputs(study_dir, records):
    """{key: {(config, run): array}} of the saved outputs (.pt beside a record)."""
    outputs = {key: {} for key in OUTPUT_KEYS}
    for record in records:
        path = os.path.join(study_dir, 'runs', record['config'], f"{record['run']:05d}.pt")
        if os.path.exists(path):
            saved = torch.load(path, weights_only=True)
            for key, value in saved.items():
                outputs[key][(record['config'], record['run'])] = value.float().numpy() \
                    if value.is_floating_point() else value.numpy()
    return outputs


def load_study(study_dir, outputs=True):
    """(runs, arrays): runs is a pandas DataFrame, one row per finished run (configuration, script
    and its SHA-256, every hyp key as a column such as 'opt.lr', the grid point, seeds, accuracies,
    time, steps, device model, host, launch ...); arrays holds the saved outputs, {'logits':
    {(config, run): fp32 array (test images, classes)}, 'logits_plain': ..., 'train_mask': ...},
    and 'test_labels' (an int array, when logits were saved)."""
    study = read_study(study_dir)
    records = load_records(study_dir, study)
    rows = [record_row(record, study['configs'][record['config']]) for record in records]
    runs = pd.DataFrame(rows)
    if len(runs):
        runs = runs.sort_values(['config', 'run'], key=lambda column: column.map(
            list(study['configs']).index) if column.name == 'config' else column,
            ignore_index=True)
    arrays = load_outputs(study_dir, records) if outputs else {}
    labels_path = os.path.join(study_dir, 'test_labels.json')
    if outputs and os.path.exists(labels_path):
        arrays['test_labels'] = np.array(read_json(labels_path, 'rerun a launch to rewrite it'))
    return runs, arrays
