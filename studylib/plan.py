"""A study's directory and its lock, the study.json of a launch (the study, checked against DIR's
and extended), and the plan of a launch: the runs still to train, once the damaged files are set
aside."""
import fcntl
import json
import os

from .config import Study
from .errors import StudyError
from .files import Damaged, scan_runs, set_aside


def differences(there, here, key=''):
    """'key (DIR's value there, this command's here)' for every setting that differs."""
    if isinstance(there, dict) and isinstance(here, dict):
        keys = [*there, *(k for k in here if k not in there)]
        return [d for k in keys for d in differences(there.get(k, 'absent'), here.get(k, 'absent'),
                                                     f'{key}.{k}' if key else k)]
    return [] if there == here else [f'{key} ({json.dumps(there)} there, {json.dumps(here)} here)']


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


def merge_study(existing, study, command):
    """The Study after this launch: the settings must be DIR's, each configuration already in it
    must be unchanged (new ones are added), and --runs may only grow."""
    if existing is None:
        study.commands = [command]
        return study
    here = {name: config.to_json() for name, config in study.configs.items()
            if name in existing.configs}
    there = {name: existing.configs[name].to_json() for name in here}
    differ = differences(existing.settings, study.to_json()['settings']) + \
        differences(there, here, 'configs')
    if differ:
        shown = '; '.join(differ[:4]) + (f'; and {len(differ) - 4} more' if len(differ) > 4 else '')
        raise StudyError(f'it holds another study: {shown}. Use another --study-dir, or a command '
                         'of its study.json to continue it (new configurations may be added)')
    if study.runs < existing.runs:
        raise StudyError(f'it holds this study with --runs {existing.runs}; --runs {study.runs} '
                         f'would leave runs out: give --runs {existing.runs} to continue it, or '
                         'more to extend it')
    grows = study.runs > existing.runs or any(name not in existing.configs
                                              for name in study.configs)
    return Study(settings=existing.settings, configs={**existing.configs, **study.configs},
                 runs=study.runs, commands=existing.commands + ([command] if grows else []),
                 launches=existing.launches,
                 target=study.target if study.target is not None else existing.target)


def open_study(study_dir, study, command, launch):
    """Rank 0 at the start of a launch: lock DIR, check that it holds this study or none (or one
    that this launch extends), and write study.json with the launch (its id, command and
    environment) added; a study.json that was read from its copy is set aside first. Returns the
    lock, the study as DIR holds it now, and the lines that say what was recovered."""
    lock, notes = lock_study_dir(study_dir), []
    try:
        existing = Study.read(study_dir)
        try:
            study = merge_study(existing, study, command)
        except StudyError as error:
            raise StudyError(f'{study_dir}: {error}') from None
        if existing is not None and existing.damaged:
            moved = set_aside(study_dir, [Damaged('study.json', 'unreadable', existing.damaged)])
            notes.append(f'{existing.damaged}: the study was read from its copy '
                         f'study.backup.json; the damaged file is kept as {", ".join(moved)}')
        study.launches = [*study.launches, launch]
        study.write(study_dir)
    except BaseException:
        lock.close()
        raise
    for directory, _, names in os.walk(os.path.join(study_dir, 'runs')):
        for name in names:  # left by a process killed while writing; nobody writes now (the lock)
            if '.tmp' in name:
                os.remove(os.path.join(directory, name))
    return lock, study, notes


def set_aside_note(study_dir, damaged, moved):
    """One line: what was set aside, where, and that those runs are trained again."""
    shown = '; '.join(entry.line() for entry in damaged[:3])
    more = f'; and {len(damaged) - 3} more' if len(damaged) > 3 else ''
    return (f'set aside {len(damaged)} damaged file{"s" if len(damaged) > 1 else ""} of '
            f'{study_dir}, not counted and kept in {study_dir}/set_aside ({len(moved)} moved): '
            f"{shown}{more}; the study's runs among them are trained again, with the same seeds")


def make_plan(study_dir, study, configs, runs, launch):
    """The runs of this launch's configurations without a finished record, run-major (the runs of
    a seed finish together, so that a partial study is paired). Every record is read and
    checked first, and the damaged files are set aside (the plan's notes say so)."""
    finished, damaged = scan_runs(study_dir, study)
    notes = [set_aside_note(study_dir, damaged, set_aside(study_dir, damaged))] if damaged else []
    jobs = [[config, run] for run in range(runs) for config in configs
            if (config, run) not in finished]
    total = len(configs) * runs
    return dict(launch=launch['id'], jobs=jobs, total=total, finished=total - len(jobs),
                environment=launch['environment'], notes=notes)
