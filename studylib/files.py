"""The files of a study directory: where each run's record, failed tries and outputs live, which
runs are finished, and writing and reading them safely."""
import json
import os
import re

from .errors import StudyError

RUN_FILE = re.compile(r'(\d{5,})\.json')  # a finished run's record, RUN.json


def atomic_write(path, content):
    """Write to a temporary file, then rename it: a crash never leaves a half-written file."""
    temporary = f'{path}.tmp{os.getpid()}'
    with open(temporary, 'wb' if isinstance(content, bytes) else 'w') as f:
        f.write(content)
    os.replace(temporary, path)


def read_json(path, what):
    """The JSON in path; an unreadable file is refused with what to do about it."""
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as error:
        raise StudyError(f'{path} is unreadable ({error}); {what}') from None


def config_dir(study_dir, config):
    return os.path.join(study_dir, 'runs', config)


def record_path(study_dir, config, run):
    return os.path.join(config_dir(study_dir, config), f'{run:05d}.json')


def failure_path(study_dir, config, run):
    """The tries of a run that failed (its exceptions), until a later launch trains it."""
    return os.path.join(config_dir(study_dir, config), f'{run:05d}.failed.json')


def outputs_path(study_dir, config, run):
    """A run's saved outputs (logits, subset mask), beside its record."""
    return os.path.join(config_dir(study_dir, config), f'{run:05d}.pt')


def finished_runs(study_dir, configs):
    """{(config, run)} of the runs with a record, from one listing of each configuration's
    directory (no record is read)."""
    finished = set()
    for config in configs:
        try:
            names = os.listdir(config_dir(study_dir, config))
        except FileNotFoundError:
            continue
        finished.update((config, int(match[1])) for name in names
                        if (match := RUN_FILE.fullmatch(name)))
    return finished
