"""One launch of a study: every process sets up (scripts, data, device), rank 0 plans, all train
from the shared queue, rank 0 writes the records and, at the end, the summary and report."""
import argparse
import datetime
import hashlib
import json
import os
import signal
import socket
import sys
import threading
import uuid

import torch

from . import report
from .cli import parse_args, parse_report_args
from .distribute import Collector, Heartbeat, World
from .environment import local_environment, world_environment
from .errors import StudyError, Stopped
from .plan import atomic_write, make_plan, open_study
from .runs import Runner
from .scripts import (config_hyp, load_script, parse_script_flags, script_label, script_path,
                      sha256_of)


def data_fingerprint(data):
    digest = hashlib.sha256()
    for split in ('train', 'test'):
        for key in ('images', 'labels'):
            digest.update(data[split][key].cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


def setup_configs(args):
    """{name: the configuration's script (label, path, SHA-256, module), its flags and hyp}."""
    modules, configs = {}, {}
    for name, (script, overrides, base, grid) in args.configs.items():
        path = script_path(script)
        if path not in modules:
            modules[path] = load_script(path)
        try:
            script_args = parse_script_flags(modules[path], args.script_flags)
            hyp = config_hyp(modules[path], script_args, overrides)
        except StudyError as error:
            raise StudyError(f'--config {name}: {error}' if args.config else str(error)) from None
        configs[name] = dict(label=script_label(path), path=path, sha256=sha256_of(path),
                             module=modules[path], args=script_args, overrides=overrides, hyp=hyp,
                             base=base, grid=grid)
    return configs


def setup_process(args, world):
    """This process's scripts, hyps, device, precision and data, and what it tells rank 0: its
    environment and data fingerprint (or the error that stops the study)."""
    main_script = load_script(script_path(args.script))
    configs = setup_configs(args)
    main_args = parse_script_flags(main_script, args.script_flags)
    try:
        device, precision = main_script.resolve_device_precision(main_args.device,
                                                                 main_args.precision)
        data = main_script.load_dataset(main_args.dataset, main_args.data_dir,
                                        main_args.train_splits.split(','),
                                        log=print if world.local_rank == 0 else lambda *_: None)
    except (ValueError, main_script.DataError) as error:
        raise StudyError(error) from None
    if args.val_split >= len(data['train']['labels']):
        raise StudyError(f"--val-split {args.val_split} leaves none of the "
                         f"{len(data['train']['labels'])} training images to train on")
    if device.type == 'cuda' and world.size > 1:  # one GPU per process
        if world.local_rank >= torch.cuda.device_count():
            raise StudyError(f'{torch.cuda.device_count()} GPUs on {socket.gethostname()}, fewer '
                             'than the processes torchrun started there (--nproc_per_node)')
        device = torch.device('cuda', world.local_rank)
    info = dict(local_environment(device, precision), data=data_fingerprint(data))
    return argparse.Namespace(main_script=main_script, main_args=main_args, configs=configs,
                              device=device, precision=precision, data=data, info=info)


def study_identity(args, process):
    """What the study is (its settings, and each configuration's script and resolved hyp), as
    JSON holds them, to compare with DIR's: a command that differs is refused."""
    data = process.data
    settings = dict(seed=args.seed, vary=args.vary, train_subset=args.train_subset,
                    val_split=args.val_split, save_logits=args.save_logits,
                    precision=process.precision, data=dict(
                        dataset=process.main_args.dataset,
                        train_splits=process.main_args.train_splits,
                        sha256=process.info['data'], num_train=len(data['train']['labels']),
                        num_test=len(data['test']['labels']), classes=list(data['classes'])))
    configs = {name: dict(script=entry['label'], script_sha256=entry['sha256'],
                          overrides=entry['overrides'], base=entry['base'], grid=entry['grid'],
                          hyp=entry['hyp'])
               for name, entry in process.configs.items()}
    return json.loads(json.dumps(settings)), json.loads(json.dumps(configs))


def check_world(infos):
    """Refuse a process's error, or processes that disagree on the data."""
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


def plan_launch(args, process, infos, command):
    """Rank 0: check the world and DIR, record the launch in study.json, and list the runs to train.
    Returns the lock on DIR and the plan."""
    check_world(infos)
    settings, configs = study_identity(args, process)
    launch = dict(id=uuid.uuid4().hex[:12], command=command, environment=world_environment(infos),
                  started=datetime.datetime.now(datetime.timezone.utc).isoformat())
    lock, study = open_study(args.study_dir, settings, configs, args.runs, command, launch)
    try:
        if args.target is not None:
            study['target'] = args.target
            atomic_write(os.path.join(args.study_dir, 'study.json'), json.dumps(study, indent=2))
        runner_files(args, process)
        plan = make_plan(args.study_dir, list(configs), args.runs, launch)
    except BaseException:
        lock.close()
        raise
    return lock, plan


def runner_files(args, process):
    """The files a study's analyses need beside its records: the held-out split of --val-split and
    the test labels that saved logits are scored against."""
    from .runs import validation_indices
    if args.val_split:
        held_out = validation_indices(len(process.data['train']['labels']), args.val_split,
                                      args.seed)
        atomic_write(os.path.join(args.study_dir, 'validation.json'),
                     json.dumps({'seed': args.seed, 'indices': held_out.tolist()}))
    if args.save_logits:
        atomic_write(os.path.join(args.study_dir, 'test_labels.json'),
                     json.dumps(process.data['test']['labels'].tolist()))


def agree_on_plan(args, world, command):
    """Every process sets up; rank 0 plans; all read the plan (or the error that stops them)."""
    process = None
    try:
        if world.local_rank != 0:  # one process per machine first: a download, the tensor cache
            world.store.wait([f'set_up/{world.node}'])
        process = setup_process(args, world)
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
            lock, plan = plan_launch(args, process, world.read_all('info'), command)
        except StudyError as error:
            plan = {'error': str(error)}
        world.publish('plan', plan)
    plan = world.read('plan')
    if 'error' in plan:
        raise StudyError(plan['error'])
    return process, plan, lock


def prepare_device(process):
    if process.device.type == 'cuda':
        torch.cuda.set_device(process.device)
    torch.backends.cudnn.benchmark = not process.main_args.deterministic
    if process.main_args.deterministic:
        os.environ.setdefault('CUBLAS_WORKSPACE_CONFIG', ':4096:8')
        torch.use_deterministic_algorithms(True)
    process.main_script.keep_freed_memory_in_process()  # the CPU's steps; harmless beside a GPU


def run_study(args, world, command):
    process, plan, lock = agree_on_plan(args, world, command)
    prepare_device(process)
    runner = Runner(args, process, world, plan['launch'])
    heartbeat, collector = Heartbeat(world), None
    heartbeat.start()
    if world.rank == 0:
        print(f"study in {args.study_dir}: {plan['finished']} of {plan['total']} runs of this "
              f"launch's configurations finished, {len(plan['jobs'])} to train; world size "
              f"{world.size} on {plan['environment']['hosts']} ({process.device.type}, "
              f'{process.precision})', flush=True)
        collector = Collector(world, plan, args.study_dir, args.lost_after)
        collector.start()
    try:
        runner.warm_up(sorted({config for config, _ in plan['jobs']}))
        while (index := world.store.add('next', 1) - 1) < len(plan['jobs']):
            if collector is not None and collector.error is not None:
                break  # rank 0 cannot write the records: stop, and say why (below)
            world.store.set(f'owner/{index}', str(world.rank))
            record, outputs = runner.run(*plan['jobs'][index])
            if outputs is not None:  # before the record: a record means the run is complete
                world.store.set(f'outputs/{index}', outputs)
            world.store.set(f'record/{index}', json.dumps(record, indent=2))
        if collector is not None:
            collector.finishing.set()
            collector.join()
    finally:
        heartbeat.stopping.set()
        if collector is not None:
            collector.stopping.set()  # stopped early: a last look for published records
            collector.join()
            if collector.error is None:
                report.write_outputs(args.study_dir)
            lock.close()
    if collector is not None and collector.error is not None:
        raise StudyError(f'rank 0 stopped collecting the records into {args.study_dir}: '
                         f'{type(collector.error).__name__}: {collector.error}')
    if collector is not None and collector.lost:
        lost = ', '.join(f"{plan['jobs'][index][0]} run {plan['jobs'][index][1]} (rank {owner})"
                         for index, owner in sorted(collector.lost.items()))
        raise StudyError(f'given up {lost}: no heartbeat from its process for '
                         f'{args.lost_after:g} s (a lost machine?). The other runs are in '
                         f'{args.study_dir}; the same command trains the missing ones')


def raise_stopped(signal_number, frame):
    raise Stopped()


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ['report']:
        return report_main(argv[1:])
    world = None
    in_main_thread = threading.current_thread() is threading.main_thread()
    if in_main_thread:  # torchrun stops the other processes with SIGTERM when one fails
        previous_handler = signal.signal(signal.SIGTERM, raise_stopped)
    try:
        args = parse_args(argv)
        world = World()
        run_study(args, world, ['study.py', *argv])
    except StudyError as error:
        # before the processes agree, each machine's first process speaks; after, rank 0 alone
        if (world.rank == 0) if world is not None else os.environ.get('LOCAL_RANK', '0') == '0':
            print(f'error: {error}', file=sys.stderr, flush=True)
        return 1
    except (KeyboardInterrupt, Stopped) as stop:
        if world is not None and world.rank == 0:
            print(f'\nStopped: the finished runs are in {args.study_dir}; the same command '
                  'continues the study.', file=sys.stderr, flush=True)
        return 130 if isinstance(stop, KeyboardInterrupt) else 143
    finally:
        if in_main_thread:
            signal.signal(signal.SIGTERM, previous_handler)
    return 0


def report_main(argv):
    try:
        args = parse_report_args(argv)
        report.write_outputs(args.study_dir, target=args.target, require_speedup=args.speedup,
                             require_variance=args.variance)
    except StudyError as error:
        print(f'error: {error}', file=sys.stderr, flush=True)
        return 1
    print(f'rebuilt {args.study_dir}: summary.json, report.md, runs.csv and the plots')
    return 0
