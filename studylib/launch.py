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
import time
import uuid

import torch

from . import distribute, report
from .cli import parse_args, parse_report_args
from .collect import Collector
from .config import Study
from .distribute import MAX_ATTEMPTS, Heartbeat, Liveness, Queue, StoreLost, World
from .environment import local_environment, world_environment
from .errors import ReportFailed, RunsFailed, StorageError, Stopped, StudyError
from .files import atomic_write
from .plan import lock_study_dir, make_plan, open_study
from .records import FailedTry, Message
from .runs import Runner, validation_indices
from .scripts import config_hyp, open_script

POLL_SECONDS = 0.5  # how often a process without a run looks for one, or for the end


def data_fingerprint(data):
    digest = hashlib.sha256()
    for split in ('train', 'test'):
        for key in ('images', 'labels'):
            digest.update(data[split][key].cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


def setup_configs(args):
    """The study's scripts ({label: Script}, each loaded once) and its configurations resolved
    ({name: Config} with the script's SHA-256 and the resolved hyp)."""
    scripts, configs = {}, {}
    for name, config in args.configs.items():
        if config.script not in scripts:
            scripts[config.script] = open_script(config.script, args.script_flags)
        script = scripts[config.script]
        try:
            hyp = config_hyp(script.module, script.args, config.overrides)
        except StudyError as error:
            raise StudyError(f'--config {name}: {error}' if args.config else str(error)) from None
        configs[name] = config.resolved(script.sha256, hyp)
    return scripts, configs


def setup_process(args, world):
    """This process's scripts, configurations, device, precision and data, and what it tells rank
    0: its environment and data fingerprint (or the error that stops the study)."""
    scripts, configs = setup_configs(args)
    main_script, main_args = scripts[args.script].module, scripts[args.script].args
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
    return argparse.Namespace(main_script=main_script, main_args=main_args, scripts=scripts,
                              configs=configs, device=device, precision=precision, data=data,
                              info=info)


def study_of(args, process):
    """What this command's study is: its settings and its configurations (each its script's
    SHA-256 and resolved hyp), to compare with DIR's (a command that differs is refused)."""
    data = process.data
    settings = dict(seed=args.seed, vary=args.vary, train_subset=args.train_subset,
                    val_split=args.val_split, save_logits=args.save_logits,
                    precision=process.precision, data=dict(
                        dataset=process.main_args.dataset,
                        train_splits=process.main_args.train_splits,
                        sha256=process.info['data'], num_train=len(data['train']['labels']),
                        num_test=len(data['test']['labels']), classes=list(data['classes'])))
    return Study(settings=settings, configs=process.configs, runs=args.runs, target=args.target)


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


def check_outputs_travel(args, data):
    """Refuse, before any training, outputs too large for the store to carry (in chunks)."""
    num_test, num_classes = len(data['test']['labels']), len(data['classes'])
    size = (2 * num_test * num_classes * 2 if args.save_logits else 0) + \
        (len(data['train']['labels']) if args.train_subset is not None else 0)
    if size > distribute.MAX_OUTPUT_BYTES:
        raise StudyError(f'the outputs of a run would be {size / 2**20:.0f} MiB (fp16 logits of '
                         f'{num_test} test images x {num_classes} classes, twice, and the subset '
                         f'mask), more than the {distribute.MAX_OUTPUT_BYTES / 2**20:.0f} MiB '
                         'a run may send to rank 0; drop --save-logits or use fewer test images')


def plan_launch(args, process, infos, command):
    """Rank 0: check the world and DIR, record the launch in study.json, and list the runs to train.
    Returns the lock on DIR and the plan."""
    check_world(infos)
    check_outputs_travel(args, process.data)
    launch = dict(id=uuid.uuid4().hex[:12], command=command, environment=world_environment(infos),
                  started=datetime.datetime.now(datetime.timezone.utc).isoformat())
    lock, study, notes = open_study(args.study_dir, study_of(args, process), command, launch)
    try:
        runner_files(args, process)
        plan = make_plan(args.study_dir, study, list(process.configs), args.runs, launch)
        plan.update(data=process.info['data'], notes=notes + plan['notes'])
    except BaseException:
        lock.close()
        raise
    return lock, plan


def runner_files(args, process):
    """The files a study's analyses need beside its records: the held-out split of --val-split and
    the test labels that saved logits are scored against."""
    if args.val_split:
        held_out = validation_indices(len(process.data['train']['labels']), args.val_split,
                                      args.seed)
        atomic_write(os.path.join(args.study_dir, 'validation.json'),
                     json.dumps({'seed': args.seed, 'indices': held_out.tolist()}))
    if args.save_logits:
        atomic_write(os.path.join(args.study_dir, 'test_labels.json'),
                     json.dumps(process.data['test']['labels'].tolist()))


def first_plan(args, world, command):
    """The launch's start: every process sets up and tells rank 0 its environment and data
    fingerprint (or its error); rank 0 checks them and DIR and publishes the plan (or the error that
    stops every process)."""
    process = None
    try:
        if world.local_rank != 0:  # one process per machine first: a download, the tensor cache
            world.store.wait_for(f'set_up/{world.node}')
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
            plan = {'error': str(error), 'exit_status': error.exit_status}
        world.publish('plan', plan)
    plan = world.read('plan')
    if 'error' in plan:
        raise SharedError(plan['error'], plan['exit_status'])
    return process, plan, lock


def join_plan(args, world):
    """A process that joins a running launch (a torchrun restart, of any rank): its own setup,
    checked against the plan's data; rank 0 takes DIR's lock again."""
    plan = world.read('plan')
    if 'error' in plan:
        raise SharedError(plan['error'], plan['exit_status'])
    process = setup_process(args, world)
    if process.info['data'] != plan['data']:
        raise StudyError(f'rank {world.rank} ({socket.gethostname()}) sees other data than the '
                         'launch it joins; give every machine the same dataset in --data-dir')
    return process, plan, lock_study_dir(args.study_dir) if world.rank == 0 else None


def prepare_device(process):
    if process.device.type == 'cuda':
        torch.cuda.set_device(process.device)
    torch.backends.cudnn.benchmark = not process.main_args.deterministic
    if process.main_args.deterministic:
        os.environ.setdefault('CUBLAS_WORKSPACE_CONFIG', ':4096:8')
        torch.use_deterministic_algorithms(True)
    process.main_script.keep_freed_memory_in_process()  # the CPU's steps; harmless beside a GPU


def failure_record(config, run, error, runner):
    """The record of a try that raised: what and where, so that the report can say so."""
    return FailedTry(config=config, run=run, error_type=type(error).__name__,
                     error=str(error)[:4000], rank=runner.world.rank, host=socket.gethostname(),
                     device=str(runner.device), device_model=runner.device_model,
                     launch=runner.launch,
                     finished=datetime.datetime.now(datetime.timezone.utc).isoformat())


def train_one(runner, config, run):
    """(record, outputs) of a run; an exception inside the run becomes a failure record (a bug in
    a copy of a script, CUDA out of memory at a large batch), and the study goes on."""
    try:
        return runner.run(config, run)
    except Exception as error:  # noqa: BLE001: every failure of a run is recorded, not fatal
        if runner.device.type == 'cuda':
            torch.cuda.empty_cache()
        return failure_record(config, run, error, runner), None


def publish(world, queue, index, record, outputs):
    """The run's outputs, then its record, under this process's token, if it still holds the
    run's lease (else another process has taken the run over: this late result is dropped)."""
    if not queue.holds(index):
        return False
    if outputs is not None:
        world.store.set_large(f'outputs/{index}/{world.token}', outputs)
    world.store.set(f'record/{index}/{world.token}',
                    Message(record=record, has_outputs=outputs is not None).encode())
    return True


class BrokenDevice:
    """Stops a process whose runs fail in a row across configurations: its device (or process) is
    broken, and it would mark every run it takes as failed."""

    def __init__(self, limit=3):
        self.limit, self.recent = limit, []

    def check(self, record):
        self.recent = [*self.recent, record][-self.limit:] if record.failed else []
        if len(self.recent) == self.limit and len({r.config for r in self.recent}) > 1:
            raise RunsFailed(f'{self.limit} runs in a row failed on this process (rank '
                             f'{record.rank}, {record.host}, {record.device}), in '
                             'different configurations: its device may be broken; the failures '
                             'are recorded, and the same command retries them')


def work(args, world, plan, runner, collector):
    """Take runs from the queue and train them until every run of the plan is done; rank 0 writes
    the records between its runs."""
    queue, broken = Queue(world, len(plan['jobs']), args.lost_after), BrokenDevice()
    rank0 = Liveness(world.store, args.lost_after)
    while True:
        claimed = queue.claim()
        if claimed is None:
            if collector is not None:
                collector.collect()
                if collector.all_done():
                    world.store.set('finished', '1')
                    return
            elif queue.finished():
                return
            elif world.store.check('member/0') and rank0.lost(
                    world.store.get('member/0').decode()):
                raise RunsFailed(f'rank 0 has sent no heartbeat for {args.lost_after:g} s: the '
                                 'records of this launch are written by rank 0 alone; run the '
                                 'command again to continue the study')
            time.sleep(POLL_SECONDS)
            continue
        index, attempts = claimed
        config, run = plan['jobs'][index]
        if attempts > MAX_ATTEMPTS:
            record, outputs = failure_record(config, run, ProcessLost(
                f'its process was lost {attempts - 1} times (killed, out of memory, or '
                'unreachable)'), runner), None
        else:
            record, outputs = train_one(runner, config, run)
        publish(world, queue, index, record, outputs)
        if collector is not None:
            collector.collect()
        broken.check(record)


class ProcessLost(Exception):
    """A run whose process was lost again and again."""


class SharedError(StudyError):
    """An error every process of the launch meets (the plan's): rank 0 says it, and every process
    exits with the status of the error rank 0 met."""

    def __init__(self, message, exit_status):
        super().__init__(message)
        self.exit_status = exit_status


def run_study(args, world, command):
    """This process's part of the launch: set up, train from the queue and, on rank 0, write the
    records, then the report (world.collector: what it wrote)."""
    replacing = world.join()
    heartbeat = Heartbeat(world)
    heartbeat.start()
    if world.store.check('plan/count'):
        process, plan, lock = join_plan(args, world)
    else:
        process, plan, lock = first_plan(args, world, command)
    prepare_device(process)
    runner = Runner(args, process, world, plan['launch'])
    collector = None
    if world.rank == 0:
        collector = world.collector = Collector(world, plan, args.study_dir)
        for note in [*args.notes, *plan.get('notes', [])]:
            print(note, flush=True)
        print(f"{'rank 0 rejoins the launch; ' if replacing else ''}study in {args.study_dir}: "
              f"{collector.finished()} of {plan['total']} runs of this launch's configurations "
              f"finished, {len(plan['jobs']) - len(collector.written) - len(collector.failed)} to "
              f"train; world size "
              f"{world.size} on {plan['environment']['hosts']} ({process.device.type}, "
              f'{process.precision})', flush=True)
    try:
        runner.warm_up(sorted({config for config, _ in plan['jobs']}))
        work(args, world, plan, runner, collector)
    except BaseException:  # stopped early: what has arrived is kept, and the report written
        heartbeat.stopping.set()
        report_error = close_launch(args, collector, lock)
        if report_error:
            print(f'warning: {report_error}', file=sys.stderr, flush=True)
        raise
    heartbeat.stopping.set()
    report_error = close_launch(args, collector, lock)
    if collector is not None and collector.failed:
        if report_error:
            print(f'warning: {report_error}', file=sys.stderr, flush=True)
        failed = sorted(collector.failed.values(), key=lambda r: (r.config, r.run))
        shown = ', '.join(f'{r.config} run {r.run} ({r.error_type})' for r in failed[:5])
        raise RunsFailed(f'{len(failed)} runs failed: {shown}{" ..." if len(failed) > 5 else ""};'
                         f' their errors are in {args.study_dir}/runs/CONFIG/RUN.failed.json, the '
                         'summary counts them, and the same command retries them')
    if report_error:
        raise ReportFailed(report_error)


def close_launch(args, collector, lock):
    """Rank 0 at the end of a launch, however it ends: the records that have arrived, then the
    report; DIR's lock released. Returns the report's failure, or None (other ranks: None)."""
    if collector is None:
        return None
    try:
        collector.collect()
    finally:
        try:
            report_error = write_report(args.study_dir, args.resolve)
        finally:
            lock.close()
    return report_error


def write_report(study_dir, resolve=None):
    """The summary, report and plots at the end of a launch; None, or what went wrong and how to
    rebuild them (the runs are written whatever the analyses raise)."""
    try:
        report.write_outputs(study_dir, resolve=resolve)
    except Exception as error:  # noqa: BLE001: whatever the analyses raise, the runs are kept
        return report_failure(study_dir, error)
    return None


def report_failure(study_dir, error):
    message = (str(error).splitlines() or [''])[0][:300]
    return (f'the report of {study_dir} could not be written ({type(error).__name__}: {message}); '
            f'the runs are kept: rebuild it with python study.py report {study_dir}')


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
    except (StudyError, StoreLost) as error:
        # an error every process meets (bad input, the plan's) is said once: before the processes
        # agree by each machine's first process, after by rank 0; a process's own by itself
        speaks = os.environ.get('LOCAL_RANK', '0') == '0' if world is None else \
            world.rank == 0 or not isinstance(error, SharedError)
        if speaks:
            where = '' if world is None or world.size == 1 or isinstance(error, SharedError) \
                else f'rank {world.rank}: '
            print(f'error: {where}{error}', file=sys.stderr, flush=True)
        return getattr(error, 'exit_status', RunsFailed.exit_status)  # StoreLost: retry
    except (KeyboardInterrupt, Stopped) as stop:
        collector = None if world is None else world.collector
        if collector is not None:
            print(f'\nStopped: {collector.finished()} of {collector.total} finished runs are in '
                  f'{args.study_dir}; the same command continues the study.', file=sys.stderr,
                  flush=True)
        elif world is not None and world.rank == 0:
            print('\nStopped before training; the same command starts or continues the study.',
                  file=sys.stderr, flush=True)
        return 130 if isinstance(stop, KeyboardInterrupt) else 143
    finally:
        if in_main_thread:
            signal.signal(signal.SIGTERM, previous_handler)
    return 0


def report_main(argv):
    """study.py report DIR: 0 with the report written (a warning line for each damaged file it
    does not count), 1 for a command or directory refused, 3 where no report could be written."""
    try:
        args = parse_report_args(argv)
        summary = report.write_outputs(args.study_dir, target=args.target, resolve=args.resolve,
                                       require_speedup=args.speedup,
                                       require_variance=args.variance, margin=args.margin,
                                       time_margin=args.time_margin)
    except StorageError as error:
        print(f'error: {error}', file=sys.stderr, flush=True)
        return ReportFailed.exit_status
    except StudyError as error:
        print(f'error: {error}', file=sys.stderr, flush=True)
        return StudyError.exit_status
    except Exception as error:  # noqa: BLE001: an analysis or a write that fails says so
        print(f'error: {report_failure(args.study_dir, error)}', file=sys.stderr, flush=True)
        return ReportFailed.exit_status
    for line in summary['damaged']:
        print(f'warning: damaged, not counted: {line}', file=sys.stderr, flush=True)
    print(f'rebuilt {args.study_dir}: summary.json, report.md, runs.csv and the plots')
    return 0
