"""What a launch trains, and how its processes agree on it: each process loads the scripts,
resolves the configurations' hyp and takes its device and data; rank 0 checks every process's
report, locks DIR, checks and extends study.json, writes DIR's side files and makes the plan all
follow: the runs still to train once damaged files are set aside (or the error that stops them)."""
import dataclasses
import datetime
import fcntl
import json
import os
import socket
import uuid
from dataclasses import dataclass

import torch

from . import distribute
from .config import ScriptFlags, Study
from .data import data_fingerprint, load_study_data
from .device import local_environment, resolve_device_precision, world_environment
from .errors import StudyError
from .files import Damaged, StudyDir, atomic_write, remove_partial_writes, scan_runs, set_aside
from .hyp import config_hyp
from .runs import validation_indices
from .scripts import open_script


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
    lock = open(StudyDir(study_dir).lock(), 'w')
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
    """Rank 0 at a launch's start: lock DIR, check that it holds this study, none, or one this
    launch extends, and write study.json with the launch added (a study.json read from its copy is
    set aside first). Returns the lock, the study as DIR holds it now, and what was recovered."""
    lock = lock_study_dir(study_dir)
    notes = []
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
    remove_partial_writes(study_dir)  # nobody writes now: the launch holds the lock
    return lock, study, notes


def set_aside_note(study_dir, damaged, moved):
    shown = '; '.join(entry.line() for entry in damaged[:3])
    more = f'; and {len(damaged) - 3} more' if len(damaged) > 3 else ''
    return (f'set aside {len(damaged)} damaged file{"s" if len(damaged) > 1 else ""} of '
            f'{study_dir}, not counted and kept in {study_dir}/set_aside ({len(moved)} moved): '
            f"{shown}{more}; the study's runs among them are trained again, with the same seeds")


@dataclass(frozen=True)
class Plan:
    """What a launch trains, as rank 0 made it and every process follows it. jobs: (config, run),
    run-major, so that the runs of a seed finish together and a partial study is paired; total and
    finished: its configurations' runs, and those finished before it; data: the fingerprint."""
    launch: str
    jobs: tuple
    total: int
    finished: int
    environment: dict
    notes: tuple
    data: str

    def to_json(self):
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, content):
        return cls(**{**content, 'jobs': tuple(map(tuple, content['jobs'])),
                      'notes': tuple(content['notes'])})


def make_plan(study_dir, study, configs, runs, launch, data, notes):
    """The Plan: the runs of this launch's configurations without a finished record. Every record
    is read and checked first, and the damaged files are set aside (the notes say so)."""
    finished, damaged = scan_runs(study_dir, study)
    if damaged:
        notes = (*notes, set_aside_note(study_dir, damaged, set_aside(study_dir, damaged)))
    jobs = tuple((config, run) for run in range(runs) for config in configs
                 if (config, run) not in finished)
    total = len(configs) * runs
    return Plan(launch=launch['id'], jobs=jobs, total=total, finished=total - len(jobs),
                environment=launch['environment'], notes=tuple(notes), data=data)


class SharedError(StudyError):
    """An error every process of the launch meets (the plan's): rank 0 says it, and every process
    exits with the status of the error rank 0 met."""

    def __init__(self, message, exit_status):
        super().__init__(message)
        self.exit_status = exit_status


@dataclass(frozen=True)
class Process:
    """This process's part of the launch, set up once: scripts ({label: Script}), configs ({name:
    Config}, resolved), info (for rank 0: its environment and the data's fingerprint)."""
    flags: ScriptFlags
    scripts: dict
    configs: dict
    device: torch.device
    precision: str
    data: dict
    info: dict


def setup_configs(request):
    """({label: Script}, {name: Config} resolved with its script's SHA-256 and hyp)."""
    scripts = {}
    configs = {}
    for name, config in request.configs.items():
        if config.script not in scripts:
            scripts[config.script] = open_script(config.script)
        script = scripts[config.script]
        try:
            hyp = config_hyp(script.method.hyp, script.method.HYP_CHOICES,
                             script.method.HYP_RANGES, request.flags, config.overrides)
        except StudyError as error:
            raise StudyError(f'--config {name}: {error}' if request.config else str(error)) \
                from None
        configs[name] = config.resolved(script.sha256, hyp)
    return scripts, configs


def setup_process(request, world):
    scripts, configs = setup_configs(request)
    flags = request.flags
    device, precision = resolve_device_precision(flags.device, flags.precision, world.local_rank)
    data = load_study_data(flags.dataset, flags.data_dir, flags.train_splits.split(','),
                           log=print if world.local_rank == 0 else lambda *_: None)
    if request.val_split >= len(data['train']['labels']):
        raise StudyError(f"--val-split {request.val_split} leaves none of the "
                         f"{len(data['train']['labels'])} training images to train on")
    info = dict(local_environment(device, precision), data=data_fingerprint(data))
    return Process(flags=flags, scripts=scripts, configs=configs, device=device,
                   precision=precision, data=data, info=info)


def study_of(request, process):
    """What this command's study is: its settings and its configurations (each its script's
    SHA-256 and resolved hyp), to compare with DIR's (a command that differs is refused)."""
    data = process.data
    settings = dict(seed=request.seed, vary=request.vary, train_subset=request.train_subset,
                    val_split=request.val_split, save_logits=request.save_logits,
                    precision=process.precision, data=dict(
                        dataset=process.flags.dataset, train_splits=process.flags.train_splits,
                        sha256=process.info['data'], num_train=len(data['train']['labels']),
                        num_test=len(data['test']['labels']), classes=list(data['classes'])))
    return Study(settings=settings, configs=process.configs, runs=request.runs,
                 target=request.target)


def check_world(infos):
    for rank, info in enumerate(infos):
        if 'error' in info:
            where = '' if rank == 0 else f" (rank {rank}, {info['host']})"
            raise StudyError(info['error'] + where)
    fingerprints = [info['data'] for info in infos]
    if len(set(fingerprints)) > 1:
        other = next(rank for rank, value in enumerate(fingerprints) if value != fingerprints[0])
        raise StudyError(f"the processes see different data: rank 0 ({infos[0]['host']}) and rank "
                         f"{other} ({infos[other]['host']}) differ; give every machine the same "
                         'dataset in --data-dir')


def check_outputs_travel(request, data):
    """Refuse, before any training, outputs too large for the store to carry (in chunks)."""
    num_test = len(data['test']['labels'])
    num_classes = len(data['classes'])
    size = (2 * num_test * num_classes * 2 if request.save_logits else 0) + \
        (len(data['train']['labels']) if request.train_subset is not None else 0)
    if size > distribute.MAX_OUTPUT_BYTES:
        raise StudyError(f'the outputs of a run would be {size / 2**20:.0f} MiB (fp16 logits of '
                         f'{num_test} test images x {num_classes} classes, twice, and the subset '
                         f'mask), more than the {distribute.MAX_OUTPUT_BYTES / 2**20:.0f} MiB '
                         'a run may send to rank 0; drop --save-logits or use fewer test images')


def plan_launch(request, process, infos, command):
    """Rank 0: check the world and DIR, record the launch, list the runs: (DIR's lock, the Plan)."""
    check_world(infos)
    check_outputs_travel(request, process.data)
    asked = dict(runs=request.runs, configs=request.config, grids=request.grid,
                 target=request.target)
    launch = dict(id=uuid.uuid4().hex[:12], command=command, request=asked,
                  environment=world_environment(infos),
                  started=datetime.datetime.now(datetime.timezone.utc).isoformat())
    lock, study, notes = open_study(request.study_dir, study_of(request, process), command, launch)
    try:
        runner_files(request, process)
        plan = make_plan(request.study_dir, study, list(process.configs), request.runs, launch,
                         process.info['data'], notes)
    except BaseException:
        lock.close()
        raise
    return lock, plan


def runner_files(request, process):
    """The files a study's analyses need beside its records: the held-out split of --val-split and
    the test labels that saved logits are scored against."""
    files = StudyDir(request.study_dir)
    if request.val_split:
        held_out = validation_indices(len(process.data['train']['labels']), request.val_split,
                                      request.seed)
        atomic_write(files.validation(),
                     json.dumps({'seed': request.seed, 'indices': held_out.tolist()}))
    if request.save_logits:
        atomic_write(files.test_labels(), json.dumps(process.data['test']['labels'].tolist()))


def read_plan(world):
    content = world.read('plan')
    if 'error' in content:
        raise SharedError(content['error'], content['exit_status'])
    return Plan.from_json(content)


def first_plan(request, world, command):
    """The launch's start: every process sets up and tells rank 0 its environment and data
    fingerprint (or its error); rank 0 checks them and DIR and publishes the plan (or the error that
    stops every process). Returns this process's Process, the Plan and DIR's lock (rank 0's)."""
    process = None
    try:
        if world.local_rank != 0:  # one process per machine first: a download, the tensor cache
            world.store.wait_for(f'set_up/{world.node}')
        process = setup_process(request, world)
        info = process.info
    except StudyError as error:
        info = dict(host=socket.gethostname(), error=str(error))
    finally:
        if world.local_rank == 0:
            world.store.set(f'set_up/{world.node}', '1')
    world.publish(f'info/{world.rank}', info)
    lock = None
    if world.rank == 0:
        try:
            lock, plan = plan_launch(request, process, world.read_all('info'), command)
            world.publish('plan', plan.to_json())
        except StudyError as error:
            world.publish('plan', {'error': str(error), 'exit_status': error.exit_status})
    return process, read_plan(world), lock


def join_plan(request, world):
    """A process that joins a running launch (a torchrun restart, of any rank): its own setup,
    checked against the plan's data; rank 0 takes DIR's lock again."""
    plan = read_plan(world)
    process = setup_process(request, world)
    if process.info['data'] != plan.data:
        raise StudyError(f'rank {world.rank} ({socket.gethostname()}) sees other data than the '
                         'launch it joins; give every machine the same dataset in --data-dir')
    return process, plan, lock_study_dir(request.study_dir) if world.rank == 0 else None
