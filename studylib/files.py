"""The files of a study directory: where each run's record, failed tries and outputs live, the one
reader that decides which runs are finished (it reads and checks every record), damaged files set
aside, and writing and reading them safely."""
import dataclasses
import glob
import json
import os
import re
import zipfile

from .errors import StorageError, StudyError
from .records import CompileRecord, RunRecord

RUN_FILE = re.compile(r'(\d{5,})\.json')          # a finished run's record, RUN.json
FAILURE_FILE = re.compile(r'(\d{5,})\.failed\.json')  # the failed tries of a run
SET_ASIDE = 'set_aside'  # DIR/set_aside/: damaged files, kept under names that say why


def atomic_write(path, content):
    """Write to a temporary file, then rename it: a crash never leaves a half-written file, and a
    write that fails (a full disk) leaves none either, and raises StorageError saying so."""
    temporary = f'{path}.tmp{os.getpid()}'
    try:
        with open(temporary, 'wb' if isinstance(content, bytes) else 'w') as f:
            f.write(content)
        os.replace(temporary, path)
    except OSError as error:
        if os.path.exists(temporary):
            os.remove(temporary)
        raise StorageError(f'{path} could not be written ({error.strerror or error}); nothing '
                           'half-written was kept: free space on its disk (or fix its '
                           'permissions), then run the same command again') from None


def load_json(path):
    """The JSON in path; ValueError saying why it cannot be read (a file cut short, or absent)."""
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as error:
        raise ValueError(f'not JSON: {error}') from None


def read_json(path, what):
    """The JSON in path; an unreadable file is refused with what to do about it."""
    try:
        return load_json(path)
    except ValueError as error:
        raise StudyError(f'{path} is unreadable ({error}); {what}') from None


@dataclasses.dataclass(frozen=True)
class StudyDir:
    """Every path of a study directory (docs/studies.md, "What comes out"): the one place that
    knows its layout; no other module joins a path under a study directory."""
    root: str

    def join(self, *parts):
        return os.path.join(self.root, *parts)

    def study_json(self):
        return self.join('study.json')

    def study_copy(self):
        """study.json's copy, written after it: a file cut short (an interrupted copy of DIR)
        leaves the other whole."""
        return self.join('study.backup.json')

    def lock(self):
        return self.join('study.lock')

    def runs(self):
        return self.join('runs')

    def config_dir(self, config):
        return self.join('runs', config)

    def record(self, config, run):
        return self.join('runs', config, f'{run:05d}.json')

    def failures(self, config, run):
        """The tries of a run that failed (its exceptions), until a later launch trains it."""
        return self.join('runs', config, f'{run:05d}.failed.json')

    def outputs(self, config, run):
        """A run's saved outputs (logits, subset mask), beside its record."""
        return self.join('runs', config, f'{run:05d}.pt')

    def set_aside(self):
        return self.join(SET_ASIDE)

    def compiles(self, launch):
        """What compiling each configuration cost each process of a launch: CompileRecords."""
        return self.join('compiles', f'{launch}.json')

    def test_labels(self):
        """The test labels that saved logits are scored against (with --save-logits)."""
        return self.join('test_labels.json')

    def validation(self):
        """The held-out training images of --val-split."""
        return self.join('validation.json')

    def summary(self):
        return self.join('summary.json')

    def runs_csv(self):
        return self.join('runs.csv')

    def report(self):
        return self.join('report.md')

    def plot(self, file_name):
        return self.join(file_name)

    def looks(self):
        """The looks at the study's results, oldest first (studylib.looks)."""
        return self.join('analysis', 'looks.json')

    def tally(self, config, key):
        """A configuration's ensemble tally of saved logits (key: logits or logits_plain)."""
        return self.join('analysis', f'{config}.{key}.tally.npz')


def write_compiles(study_dir, launch, records):
    path = StudyDir(study_dir).compiles(launch)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    atomic_write(path, json.dumps([record.to_json() for record in records], indent=2))


def read_compiles(study_dir, launch):
    """The CompileRecords of a launch ([] where it wrote none: a launch of an older study.py, or
    one stopped before its warmups); a file that cannot be read counts none (it only informs)."""
    try:
        content = load_json(StudyDir(study_dir).compiles(launch))
        return [CompileRecord.from_json(entry) for entry in content]
    except (ValueError, TypeError, AttributeError):
        return []


@dataclasses.dataclass(frozen=True)
class Damaged:
    """A file of the study that is not counted: its path under DIR, why (a word that names it when
    set aside: unreadable, outputs-unreadable, misplaced, no-configuration), and the detail."""
    path: str
    why: str
    detail: str

    def line(self):
        return f'{self.path} ({self.why}: {self.detail})'


def read_record(path, config, run):
    """The RunRecord in path, which must be run `run` of `config`: ValueError saying what is
    wrong with a record that cannot be read, LookupError for one of another run."""
    record = RunRecord.from_json(load_json(path))
    if (record.config, record.run) != (config, run):
        raise LookupError(f'it is run {record.run} of {record.config}, not run {run} of {config}')
    return record


def outputs_intact(path):
    """Whether a run's outputs file is whole: torch.save writes a zip archive, whose directory
    comes last, so a file cut short has none (zipfile looks for it without reading the rest)."""
    return not os.path.exists(path) or zipfile.is_zipfile(path)


def scan_config(study_dir, config, expects_outputs):
    """({run: RunRecord}, [Damaged]) of one configuration's directory."""
    finished = {}
    damaged = []
    files = StudyDir(study_dir)
    try:
        names = sorted(os.listdir(files.config_dir(config)))
    except FileNotFoundError:
        return finished, damaged
    for name in names:
        match = RUN_FILE.fullmatch(name)
        if not match:
            continue
        run = int(match[1])
        relative = os.path.join('runs', config, name)
        try:
            finished[run] = read_record(files.join(relative), config, run)
        except LookupError as error:
            damaged.append(Damaged(relative, 'misplaced', str(error)))
            continue
        except ValueError as error:
            damaged.append(Damaged(relative, 'unreadable', str(error)))
            continue
        if expects_outputs and not outputs_intact(files.outputs(config, run)):
            del finished[run]
            damaged.append(Damaged(relative, 'outputs-unreadable',
                                   f'its outputs {run:05d}.pt are cut short'))
    for name in names:
        if FAILURE_FILE.fullmatch(name):
            relative = os.path.join('runs', config, name)
            try:
                read_failures(files.join(relative))
            except ValueError as error:
                damaged.append(Damaged(relative, 'unreadable', str(error)))
    return finished, damaged


def failure_files(study_dir, config):
    directory = glob.escape(StudyDir(study_dir).config_dir(config))
    return sorted(glob.glob(os.path.join(directory, '[0-9]*.failed.json')))


def remove_partial_writes(study_dir):
    """Remove the temporary files of writes that a killed process left under DIR/runs (only while
    no process writes: the launch that holds DIR's lock, before its runs)."""
    for directory, _, names in os.walk(StudyDir(study_dir).runs()):
        for name in names:
            if '.tmp' in name:
                os.remove(os.path.join(directory, name))


def read_failures(path):
    """A RUN.failed.json: {'config', 'run', 'failures': [a dict per try]}; ValueError if damaged."""
    content = load_json(path)
    failures = content.get('failures') if isinstance(content, dict) else None
    if not isinstance(failures, list) or not all(isinstance(f, dict) for f in failures):
        raise ValueError('it holds no list of failed tries')
    return content


def scan_runs(study_dir, study):
    """({(config, run): RunRecord} of the finished runs, [Damaged]): the one reader of records, for
    the plan and the report. A record that cannot be read, lacks a field, sits in another run's
    place or whose outputs are cut short is not finished; a configuration directory study.json
    does not name is damaged whole (its records would count for a later configuration so named)."""
    expects_outputs = bool(study.settings.get('save_logits')) or \
        study.settings.get('train_subset') is not None
    finished = {}
    damaged = []
    for config in study.configs:
        records, found = scan_config(study_dir, config, expects_outputs)
        finished.update(((config, run), record) for run, record in records.items())
        damaged += found
    runs_dir = StudyDir(study_dir).runs()
    strays = sorted(set(os.listdir(runs_dir)) - set(study.configs)) \
        if os.path.isdir(runs_dir) else []
    damaged += [Damaged(os.path.join('runs', name), 'no-configuration',
                        f'study.json has no configuration {name}') for name in strays]
    return finished, damaged


def set_aside(study_dir, damaged):
    """Move each damaged file (a record with its outputs) to DIR/set_aside/PATH.WHY (PATH.WHY.2 ...
    where taken): kept, never deleted, no longer counted. Returns where each went."""
    moved = []
    files = StudyDir(study_dir)
    for entry in damaged:
        source = files.join(entry.path)
        companions = [source]
        if entry.path.endswith('.json') and RUN_FILE.fullmatch(os.path.basename(entry.path)):
            companions.append(source[:-len('.json')] + '.pt')
        for path in companions:
            if not os.path.exists(path):
                continue
            relative = os.path.relpath(path, files.runs()) \
                if entry.path.startswith('runs') else os.path.basename(path)
            target = free_name(os.path.join(files.set_aside(), f'{relative}.{entry.why}'))
            os.makedirs(os.path.dirname(target), exist_ok=True)
            os.replace(path, target)
            moved.append(os.path.relpath(target, study_dir))
    return moved


def free_name(path):
    candidate = path
    number = 1
    while os.path.exists(candidate):
        number += 1
        candidate = f'{path}.{number}'
    return candidate
