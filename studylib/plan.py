"""What a study is (study.json), the study directory and its lock, and the plan of a launch: the
runs still to train."""
import fcntl
import json
import os

from .errors import StudyError

SOURCES = ('init', 'order', 'aug')  # the sources of randomness of the scripts' source_seeds


def atomic_write(path, content):
    """Write to a temporary file, then rename it: a crash never leaves a half-written file."""
    temporary = f'{path}.tmp{os.getpid()}'
    with open(temporary, 'wb' if isinstance(content, bytes) else 'w') as f:
        f.write(content)
    os.replace(temporary, path)


def record_path(study_dir, config, run):
    return os.path.join(study_dir, 'runs', config, f'{run:05d}.json')


def failure_path(study_dir, config, run):
    """The tries of a run that failed (its exceptions), until a later launch trains it."""
    return os.path.join(study_dir, 'runs', config, f'{run:05d}.failed.json')


def read_json(path, what):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as error:
        raise StudyError(f'{path} is unreadable ({error}); {what}') from None


def read_records(study_dir, configs, runs):
    """{(config, run): record} of the finished runs (those with a record)."""
    return {(config, run): read_json(path, 'remove it to train that run again')
            for config in configs for run in range(runs)
            if os.path.exists(path := record_path(study_dir, config, run))}


def differences(there, here, key=''):
    """'key (DIR's value there, this command's here)' for every setting that differs."""
    if isinstance(there, dict) and isinstance(here, dict):
        keys = [*there, *(k for k in here if k not in there)]
        return [d for k in keys for d in differences(there.get(k, 'absent'), here.get(k, 'absent'),
                                                     f'{key}.{k}' if key else k)]
    return [] if there == here else [f'{key} ({json.dumps(there)} there, {json.dumps(here)} here)']


def run_seeds(source_seeds, seed, run, vary):
    """Run `run`'s seeds of the three sources: run i's for the varied ones, run 0's otherwise."""
    varied, held = source_seeds(seed + run), source_seeds(seed)
    return {source: (varied if vary in (source, 'all') else held)[source] for source in SOURCES}


def lock_study_dir(study_dir):
    """DIR/study.lock, held by the launch running the study (released when its process ends)."""
    if os.path.exists(study_dir) and not os.path.isdir(study_dir):
        raise StudyError(f'--study-dir {study_dir} is a file, not a directory; give a directory '
                         '(new or holding this study)')
    os.makedirs(study_dir, exist_ok=True)
    lock = open(os.path.join(study_dir, 'study.lock'), 'w')
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.close()
        raise StudyError(f'another launch is running the study in {study_dir}; wait for it to end '
                         '(or stop it), then run this command again to continue') from None
    return lock


def merge_study(existing, settings, configs, runs, command):
    """study.json's content after this launch: the settings must be the study's, each configuration
    already in it must be unchanged (new ones are added), and --runs may only grow."""
    if existing is None:
        return dict(settings=settings, configs=configs, runs=runs, commands=[command], launches=[])
    if not isinstance(existing.get('configs'), dict) or 'settings' not in existing:
        raise StudyError('the study.json there was written by an older study.py; continue it with '
                         'that version, or use another --study-dir')
    differ = differences(existing['settings'], settings)
    differ += differences({name: existing['configs'][name] for name in configs
                           if name in existing['configs']},
                          {name: config for name, config in configs.items()
                           if name in existing['configs']}, 'configs')
    if differ:
        shown = '; '.join(differ[:4]) + (f'; and {len(differ) - 4} more' if len(differ) > 4 else '')
        raise StudyError(f'it holds another study: {shown}. Use another --study-dir, or a command '
                         'of its study.json to continue it (new configurations may be added)')
    if runs < existing['runs']:
        raise StudyError(f"it holds this study with --runs {existing['runs']}; --runs {runs} would "
                         f"leave runs out: give --runs {existing['runs']} to continue it, or more "
                         'to extend it')
    grows = runs > existing['runs'] or any(name not in existing['configs'] for name in configs)
    commands = existing['commands'] + ([command] if grows else [])
    return dict(settings=settings, configs={**existing['configs'], **configs}, runs=runs,
                commands=commands, launches=existing.get('launches', []))


def open_study(study_dir, settings, configs, runs, command, launch):
    """Rank 0 at the start of a launch: lock DIR, check that it holds this study or none (or one
    that this launch extends), and write study.json with the launch (its id, command and
    environment) added. Returns the lock and the study."""
    lock = lock_study_dir(study_dir)
    path = os.path.join(study_dir, 'study.json')
    try:
        existing = read_json(path, 'use another --study-dir, or restore it') \
            if os.path.exists(path) else None
        try:
            study = merge_study(existing, settings, configs, runs, command)
        except StudyError as error:
            raise StudyError(f'{study_dir}: {error}') from None
        study['launches'].append(launch)
        atomic_write(path, json.dumps(study, indent=2))
    except BaseException:
        lock.close()
        raise
    for directory, _, names in os.walk(os.path.join(study_dir, 'runs')):
        for name in names:  # left by a process killed while writing; nobody writes now (the lock)
            if '.tmp' in name:
                os.remove(os.path.join(directory, name))
    return lock, study


def make_plan(study_dir, configs, runs, launch):
    """The runs of this launch's configurations without a record, run-major (the runs of a seed
    finish together, so that a partial study is paired)."""
    finished = read_records(study_dir, configs, runs)
    jobs = [[config, run] for run in range(runs) for config in configs
            if (config, run) not in finished]
    total = len(configs) * runs
    return dict(launch=launch['id'], jobs=jobs, total=total, finished=total - len(jobs),
                environment=launch['environment'])
