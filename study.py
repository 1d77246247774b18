"""study.py: many trainings of an airbench script, on every GPU of one or many machines, with the
statistics, per-example outputs, seeds and held-out splits that research studies need.

    python study.py SCRIPT --runs N --study-dir DIR [--config NAME [KEY=VALUE ...]]...
                    [--seed S] [--vary init|order|aug|all] [--target ACC] [--save-logits]
                    [--train-subset FRACTION] [--val-split N] [-- FLAGS FOR THE SCRIPT]
    torchrun --nproc_per_node=8 study.py SCRIPT ...              (every GPU of a machine)
    torchrun --nnodes=2 --node-rank=R --nproc_per_node=8 --rdzv-endpoint=HOST:PORT study.py ...

Configurations and seeds. Each --config NAME KEY=VALUE... is the script's hyp with those overrides
(no --config: one configuration, 'baseline', the script as it is), after the script's own flags
(--epochs, --hyp). Each configuration runs N times, and run i of every configuration uses the same
seeds, so configurations compare pair by pair. A run's three sources of randomness each have their
own seed (initialization, data order, augmentation: the script's source_seeds): the sources named
by --vary take run i's seeds, source_seeds(S + i), the others are held at source_seeds(S).

Work distribution. Everything goes through torch.distributed's key-value store: the TCPStore that
torchrun serves on node 0 (in one plain process, an in-memory HashStore). There is no process group
and no collective: only small messages travel, and a process that dies blocks nobody else.
1. Setup: every process loads the data (one per machine first, so a download or a tensor cache is
   made once) and publishes its data fingerprint and environment. Rank 0 checks DIR, takes its lock
   (DIR/study.lock, so a second launch on DIR is refused), lists the runs without a record and
   publishes that list, the plan; every process reads it. Any process's error stops all of them
   with one message.
2. Queue: a process claims the next run of the plan with store.add('next', 1), an atomic counter,
   so each run is handed out once and faster devices take more runs. It trains the run and
   publishes its record and outputs under the run's index.
3. Rank 0's collector thread writes each published record into DIR as it arrives and prints one
   line of progress per run; machines need not share a filesystem, only rank 0 touches DIR. Every
   process sends a heartbeat. Once no run is left to claim, rank 0 waits for the runs in flight and
   gives up a run whose process has sent no heartbeat for --lost-after seconds (a lost machine):
   the study stops with a message, and the next launch trains that run.

Resumption. A run is finished when its record, DIR/runs/CONFIG/RUN.json, exists; it is written
atomically by rank 0 after the run's outputs (RUN.pt, with --save-logits or --train-subset). A
launch trains only the runs without a record, so the same command continues a study after Ctrl-C,
kill -9 of any process or a lost machine, and a stop loses at most the runs in training (and the
records rank 0 had not yet written, for a fraction of a second). DIR/study.json holds what the study
is; a command that differs is refused, saying what differs, except that a larger --runs extends it.
DIR/summary.json, report.md, accuracy.png and time.png are rewritten at the end of every launch.
"""
import argparse
import contextlib
import datetime
import fcntl
import hashlib
import importlib.util
import io
import json
import math
import os
import platform
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
import warnings

import torch
import torch.distributed as dist

REPO = os.path.dirname(os.path.abspath(__file__))
SOURCES = ('init', 'order', 'aug')  # the sources of randomness of the scripts' source_seeds
# What study.py uses of a script (its method and the shared part below its banner)
SCRIPT_API = ('hyp', 'train', 'build_net', 'infer', 'CifarLoader', 'source_seeds', 'parse_args',
              'study_hyp', 'load_dataset', 'dummy_dataset', 'resolve_device_precision',
              'DataError', 'keep_freed_memory_in_process')
POLL_SECONDS = 0.2       # how often rank 0 looks for published records
HEARTBEAT_SECONDS = 2.0  # how often every process says that it is alive


class StudyError(Exception):
    """Bad input or a study directory in the way; the message says what to do."""


class Stopped(Exception):
    """SIGTERM, as torchrun sends to the other processes when one fails."""


# ----------------------------------------- Command line ------------------------------------------
class Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, not the usage text, and not on every process
        raise StudyError(message)


def available_scripts():
    return sorted(name.removesuffix('.py') for name in os.listdir(REPO)
                  if re.fullmatch(r'airbench.*\.py', name))


def parse_args(argv):
    argv = list(argv)
    split = argv.index('--') if '--' in argv else len(argv)
    argv, script_flags = argv[:split], argv[split + 1:]
    parser = Parser(description=' '.join(__doc__.split('\n\n')[0].split()),
                    epilog='Flags after -- go to the script (python SCRIPT.py --help): data, '
                    'device, precision, --epochs, --hyp ... Under torchrun: one process per GPU.',
                    formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add = parser.add_argument
    add('script', help=f'one of {", ".join(available_scripts())} (with or without .py)')
    add('--runs', type=int, required=True, help='runs of each configuration')
    add('--study-dir', required=True, help='where the study lives (on the machine of rank 0)')
    add('--config', nargs='+', action='append', default=[], metavar=('NAME', 'KEY=VALUE'),
        help='a configuration (repeatable): a name and hyperparameter overrides, e.g. '
        '--config random aug.flip=random; the first is the baseline of the comparisons')
    add('--seed', type=int, default=0, help='run i takes its varied seeds from seed + i')
    add('--vary', choices=['init', 'order', 'aug', 'all'], default='all',
        help='the sources of randomness that change from run to run; the others are held')
    add('--target', type=float, help='test that the mean accuracy exceeds it (one-sided t-test)')
    add('--save-logits', action='store_true', help="keep each run's test logits (fp16)")
    add('--train-subset', type=float, metavar='FRACTION', help='train each run on its own random '
        'fraction of the training set (the mask is saved with the run)')
    add('--val-split', type=int, default=0, metavar='N', help='hold N training images out (a fixed '
        'split) and evaluate on them; test accuracy is recorded too')
    add('--lost-after', type=float, default=300, metavar='SECONDS', help='give up a run whose '
        'process has sent no heartbeat for this long (a lost machine)')
    args = parser.parse_args(argv)
    args.script = os.path.basename(args.script).removesuffix('.py')
    if args.script not in available_scripts():
        raise StudyError(f'unknown script {args.script!r}; the scripts in {REPO} are '
                         f'{", ".join(available_scripts())}')
    if args.runs < 1:
        raise StudyError(f'--runs must be at least 1, not {args.runs}')
    if args.train_subset is not None and not 0 < args.train_subset <= 1:
        raise StudyError(f'--train-subset is a fraction in (0, 1], not {args.train_subset}')
    if args.val_split < 0:
        raise StudyError(f'--val-split is a number of images, not {args.val_split}')
    if not args.lost_after > 0:
        raise StudyError(f'--lost-after is a positive number of seconds, not {args.lost_after}')
    names = [config[0] for config in args.config]
    for name in names:
        if not re.fullmatch(r'[A-Za-z0-9][A-Za-z0-9_.+-]*', name):
            raise StudyError(f'--config {name}: a configuration starts with its NAME (letters, '
                             'digits, _.+-), then KEY=VALUE ...: --config random aug.flip=random')
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise StudyError(f'configuration names must differ; used more than once: '
                         f'{", ".join(repeated)}')
    args.configs = {config[0]: config[1:] for config in args.config} or {'baseline': []}
    args.script_flags = script_flags
    return args


def load_script(name):
    spec = importlib.util.spec_from_file_location(name, os.path.join(REPO, f'{name}.py'))
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    missing = [attribute for attribute in SCRIPT_API if not hasattr(script, attribute)]
    if missing:
        raise StudyError(f'{name}.py lacks {", ".join(missing)}, which study.py needs')
    return script


def parse_script_flags(script, flags):
    """The script's arguments from the flags after --, refused when they are study.py's own."""
    messages = io.StringIO()
    try:
        with contextlib.redirect_stderr(messages):
            script_args, defaults = script.parse_args(flags), script.parse_args([])
    except SystemExit:  # argparse's error: keep its last line, the message, not the usage
        message = messages.getvalue().strip().splitlines()[-1].partition('error: ')[2]
        raise StudyError(f'the flags after -- are not valid for the script: {message}') from None
    for key, flag in (('runs', '--runs'), ('seed', '--seed'), ('log_dir', '--log-dir')):
        if getattr(script_args, key) != getattr(defaults, key):
            raise StudyError(f'{flag} after -- is for the script alone; study.py has its own '
                             f'(--runs, --seed before --) and writes to --study-dir')
    return script_args


def check_key(hyp, key):
    """Refuse a KEY of KEY=VALUE that is not in hyp, naming the keys there are."""
    *groups, name = key.split('.')
    node, path = hyp, []
    for part in [*groups, name]:
        if not isinstance(node, dict) or part not in node:
            where = '.'.join(path) or 'hyp'
            there = ', '.join(node) if isinstance(node, dict) else 'no keys'
            raise StudyError(f'no hyperparameter {key} ({where} has {there})')
        node, path = node[part], [*path, part]


def config_hyps(script, script_args, configs):
    """{name: hyp}: the script's hyp with its flags (--epochs, --hyp ...) and then each
    configuration's overrides, whose values the script's own --hyp parser checks."""
    hyps = {}
    for name, overrides in configs.items():
        try:
            for override in overrides:
                key, sep, _ = override.partition('=')
                if not sep:
                    raise StudyError(f'{override!r} is not KEY=VALUE (for example opt.lr=10)')
                check_key(script.hyp, key)
            flags = argparse.Namespace(**{**vars(script_args), 'hyp': script_args.hyp + overrides})
            hyps[name] = script.study_hyp(flags)
        except (StudyError, ValueError) as error:
            raise StudyError(f'--config {name}: {error}') from None
    return hyps


def run_seeds(script, seed, run, vary):
    """Run `run`'s seeds of the three sources: run i's for the varied ones, run 0's otherwise."""
    varied, held = script.source_seeds(seed + run), script.source_seeds(seed)
    return {source: (varied if vary in (source, 'all') else held)[source] for source in SOURCES}


def derived_seed(*parts):
    """A seed for something other than the three sources (a subset, the validation split)."""
    return int.from_bytes(hashlib.sha256(repr(parts).encode()).digest()[:7], 'little')


# --------------------------------------------- Data ----------------------------------------------
def data_fingerprint(data):
    digest = hashlib.sha256()
    for split in ('train', 'test'):
        for key in ('images', 'labels'):
            digest.update(data[split][key].cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


def validation_indices(num_train, val_split, seed):
    """The held-out training images of --val-split: a fixed random set, ascending."""
    generator = torch.Generator().manual_seed(derived_seed('validation', seed))
    return torch.randperm(num_train, generator=generator)[:val_split].sort().values


def training_mask(num_train, held_out, fraction, seed):
    """The training images of a run: all but the held-out ones, or a random fraction of those."""
    mask = torch.ones(num_train, dtype=torch.bool)
    mask[held_out] = False
    if fraction is not None:
        candidates = mask.nonzero().flatten()
        generator = torch.Generator().manual_seed(seed)
        chosen = candidates[torch.randperm(len(candidates), generator=generator)]
        mask[chosen[round(fraction * len(candidates)):]] = False
    return mask


# ------------------------------------- The study directory ---------------------------------------
def atomic_write(path, content):
    """Write to a temporary file, then rename it: a crash never leaves a half-written file."""
    temporary = f'{path}.tmp{os.getpid()}'
    with open(temporary, 'wb' if isinstance(content, bytes) else 'w') as f:
        f.write(content)
    os.replace(temporary, path)


def record_path(study_dir, config, run):
    return os.path.join(study_dir, 'runs', config, f'{run:05d}.json')


def read_records(study_dir, configs, runs):
    """{(config, run): record} of the finished runs (those with a record)."""
    records = {}
    for config in configs:
        for run in range(runs):
            path = record_path(study_dir, config, run)
            if os.path.exists(path):
                try:
                    with open(path) as f:
                        records[(config, run)] = json.load(f)
                except (OSError, ValueError) as error:
                    raise StudyError(f'{path} is unreadable ({error}); remove it to train that '
                                     'run again') from None
    return records


def differences(there, here, key=''):
    """'key (DIR's value there, this command's here)' for every setting that differs."""
    if isinstance(there, dict) and isinstance(here, dict):
        keys = [*there, *(k for k in here if k not in there)]
        return [d for k in keys for d in differences(there.get(k, 'absent'), here.get(k, 'absent'),
                                                     f'{key}.{k}' if key else k)]
    return [] if there == here else [f'{key} ({json.dumps(there)} there, {json.dumps(here)} here)']


def open_study(study_dir, settings, runs, command):
    """Rank 0 at the start of a launch: lock DIR, check that it holds this study or none, and
    record the study (and the command that set its runs) in study.json. Returns the lock, held
    until the launch ends."""
    os.makedirs(study_dir, exist_ok=True)
    lock = open(os.path.join(study_dir, 'study.lock'), 'w')
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.close()
        raise StudyError(f'another launch is running the study in {study_dir}; wait for it to end '
                         '(or stop it), then run this command again to continue') from None
    path = os.path.join(study_dir, 'study.json')
    try:
        if os.path.exists(path):
            try:
                with open(path) as f:
                    existing = json.load(f)
            except ValueError as error:
                raise StudyError(f'{path} is unreadable ({error}); use another --study-dir, or '
                                 'restore it') from None
            differ = differences({k: existing.get(k, 'absent') for k in settings}, settings)
            if differ:
                shown = '; '.join(differ[:4]) + (f'; and {len(differ) - 4} more'
                                                 if len(differ) > 4 else '')
                raise StudyError(f'{study_dir} holds another study: {shown}. Use another '
                                 '--study-dir, or the command in its study.json to continue it')
            if runs < existing['runs']:
                raise StudyError(f"{study_dir} holds this study with --runs {existing['runs']}; "
                                 f'--runs {runs} would leave runs out: give --runs '
                                 f"{existing['runs']} to continue it, or more to extend it")
            command = existing['command'] if runs == existing['runs'] else command
        atomic_write(path, json.dumps({**settings, 'runs': runs, 'command': command}, indent=2))
    except BaseException:
        lock.close()
        raise
    for directory, _, names in os.walk(os.path.join(study_dir, 'runs')):
        for name in names:  # left by a process killed while writing; nobody writes now (the lock)
            if '.tmp' in name:
                os.remove(os.path.join(directory, name))
    return lock


# ----------------------------------------- Distribution ------------------------------------------
class World:
    """This process's place among the study's processes, and the key-value store they share:
    torchrun's (env:// rendezvous: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT), or in one plain
    process an in-memory one. Keys are prefixed by the launch attempt (torchrun restarts)."""

    def __init__(self):
        if 'WORLD_SIZE' in os.environ:
            store, self.rank, self.size = next(dist.rendezvous('env://'))
        else:
            store, self.rank, self.size = dist.HashStore(), 0, 1
        attempt = os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')
        self.store = dist.PrefixStore(f'airbench_study/{attempt}/', store)
        self.local_rank = int(os.environ.get('LOCAL_RANK', 0))
        self.node = os.environ.get('GROUP_RANK', socket.gethostname())

    def publish(self, key, value):
        self.store.set(key, json.dumps(value))

    def read(self, key):
        """The value published under key, waiting for it."""
        return json.loads(self.store.get(key))

    def read_all(self, key):
        """Every rank's value published under key/RANK, waiting for them all."""
        return [self.read(f'{key}/{rank}') for rank in range(self.size)]


class Heartbeat(threading.Thread):
    """Adds 1 to alive/RANK in the store every HEARTBEAT_SECONDS while the process lives."""

    def __init__(self, world):
        super().__init__(daemon=True)
        self.world, self.stopping = world, threading.Event()

    def run(self):
        try:
            while not self.stopping.wait(HEARTBEAT_SECONDS):
                self.world.store.add(f'alive/{self.world.rank}', 1)
        except Exception:  # the store is gone, so is the study: the main thread finds out too
            pass


class Collector(threading.Thread):
    """Rank 0: writes every record published in the store into DIR as it arrives (outputs first,
    the record last), and prints a line of progress for each. Ends when every run of the plan is
    written, or when stopping (after a last look); once finishing (no run left to claim), gives up
    the runs whose process has sent no heartbeat for lost_after seconds."""

    def __init__(self, world, plan, study_dir, lost_after):
        super().__init__(daemon=True)
        self.world, self.jobs, self.study_dir = world, plan['jobs'], study_dir
        self.lost_after = lost_after
        self.total, self.finished = plan['total'], plan['finished']
        self.claimed, self.in_flight, self.lost, self.error = 0, set(), {}, None
        self.last_beat = {}  # run index -> (its owner and heartbeat count, when they last changed)
        self.finishing, self.stopping = threading.Event(), threading.Event()
        self.start_time = time.perf_counter()

    def run(self):
        try:
            while not self.stopping.is_set() and (self.claimed < len(self.jobs) or self.in_flight):
                self.collect()
                if self.finishing.is_set():
                    self.give_up_lost()
                time.sleep(POLL_SECONDS)
            self.collect()
        except Exception as error:  # DIR unwritable, the store gone: the main thread says so
            self.error = error

    def collect(self):
        store = self.world.store
        claimed = min(store.add('next', 0), len(self.jobs))
        self.in_flight.update(range(self.claimed, claimed))
        self.claimed = claimed
        for index in sorted(self.in_flight):
            if not store.check([f'record/{index}']):
                continue
            record_text = store.get(f'record/{index}')
            config, run = self.jobs[index]
            path = record_path(self.study_dir, config, run)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            if store.check([f'outputs/{index}']):
                atomic_write(path.removesuffix('.json') + '.pt', store.get(f'outputs/{index}'))
            atomic_write(path, record_text)
            for key in ('record', 'outputs', 'owner'):
                store.delete_key(f'{key}/{index}')
            self.in_flight.discard(index)
            self.progress(json.loads(record_text))

    def progress(self, record):
        self.finished += 1
        done_here = self.finished - (self.total - len(self.jobs))
        left = self.total - self.finished
        eta = (time.perf_counter() - self.start_time) / done_here * left
        flag = ' (the loss diverged)' if record['diverged'] else ''
        print(f"[{self.finished}/{self.total} done, {left} left, ETA "
              f"{datetime.timedelta(seconds=round(eta))}] {record['config']} run {record['run']}: "
              f"{record['accuracy_on']} accuracy {record['accuracy']:.4f}{flag}, "
              f"{record['total_time_seconds']:.2f} s (rank {record['rank']}, {record['host']})",
              flush=True)

    def give_up_lost(self):
        store, now = self.world.store, time.perf_counter()
        for index in sorted(self.in_flight):
            owner = int(store.get(f'owner/{index}')) if store.check([f'owner/{index}']) else None
            beat = (owner, None if owner is None else store.add(f'alive/{owner}', 0))
            if self.last_beat.get(index, (None, None))[0] != beat:
                self.last_beat[index] = (beat, now)
            elif now - self.last_beat[index][1] > self.lost_after:
                self.lost[index] = owner
                self.in_flight.discard(index)


# --------------------------------------------- Runs ----------------------------------------------
class Runner:
    """Trains runs of the study on this process's device and makes their records."""

    def __init__(self, args, process, world, launch):
        self.args, self.world, self.launch = args, world, launch
        self.script, self.script_args, self.hyps = process.script, process.script_args, process.hyps
        self.device, self.precision, data = process.device, process.precision, process.data
        self.nets = {}  # one network per architecture, reinitialized by every run
        on_device = lambda split: {key: value.to(self.device) for key, value in split.items()}
        self.train_split, self.test_split = on_device(data['train']), on_device(data['test'])
        self.data = {key: data[key] for key in ('classes', 'mean', 'std')}
        self.held_out, self.eval_split = None, self.test_split
        if args.val_split:
            self.held_out = validation_indices(len(data['train']['labels']), args.val_split,
                                               args.seed)
            self.eval_split = {key: value[self.held_out.to(self.device)]
                               for key, value in self.train_split.items()}

    def net(self, hyp, seeds):
        """The network for hyp's architecture, built (and warmed up, untimed) on first use."""
        key = json.dumps(hyp['net'], sort_keys=True)
        if key not in self.nets:
            num_classes = len(self.data['classes'])
            self.nets[key] = self.script.build_net(hyp['net'], num_classes, self.device,
                                                   self.precision)
            if self.script_args.warmup:  # first-call costs (allocation, autotuning, compilation)
                dummy = self.script.dummy_dataset(num_classes, hyp['opt']['batch_size'],
                                                  len(self.eval_split['labels']), self.device)
                self.script.train(dummy, hyp, self.device, self.precision, seeds, self.nets[key],
                                  epoch_eval=False)
        return self.nets[key]

    def tta_logits(self, net, images, hyp):
        """A trained network's TTA logits (fp32) for uint8 images, normalized by the script's own
        loader, as train() normalizes its test images."""
        dtype = torch.float16 if self.precision == 'fp16' else torch.float32
        loader = self.script.CifarLoader(images, None, len(images), self.data['mean'],
                                         self.data['std'], hyp['aug'], dtype)
        inputs = loader.normalize(loader.images)
        autocast = torch.autocast(self.device.type, dtype=torch.bfloat16,
                                  enabled=(self.precision == 'bf16'))
        return self.script.infer(net, inputs, hyp['net']['tta_level'], autocast)

    def run(self, config, run):
        """Train one run: its record, and its outputs (logits, subset mask) as torch.save bytes."""
        args, hyp = self.args, self.hyps[config]
        seeds = run_seeds(self.script, args.seed, run, args.vary)
        record = dict(config=config, run=run, seed=args.seed + run, seeds=seeds, vary=args.vary)
        mask = None
        if args.train_subset is not None:
            record['subset_seed'] = derived_seed('subset', args.seed + run)
        if args.train_subset is not None or self.held_out is not None:
            mask = training_mask(len(self.train_split['labels']),
                                 [] if self.held_out is None else self.held_out, args.train_subset,
                                 record.get('subset_seed'))
        train_split = self.train_split if mask is None else {
            key: value[mask.to(self.device)] for key, value in self.train_split.items()}
        run_data = {**self.data, 'train': train_split, 'test': self.eval_split}
        result = self.script.train(run_data, hyp, self.device, self.precision, seeds,
                                   self.net(hyp, seeds), self.script_args.epoch_eval)
        losses = result['epoch_train_losses']
        record.update(
            accuracy=result['tta_val_acc'],  # what the statistics are of
            accuracy_on='test' if self.held_out is None else 'validation',
            test_acc=result['tta_val_acc'], val_acc=result['val_acc'],
            total_time_seconds=result['total_time_seconds'], steps=result['steps'],
            epoch_train_losses=[loss if math.isfinite(loss) else None for loss in losses],
            diverged=not all(map(math.isfinite, losses)), train_images=len(train_split['labels']))
        outputs = {}
        if args.save_logits or self.held_out is not None:  # test logits: not what train() saw
            # in fp16, as they are kept, so that the kept logits give test_acc exactly
            logits = self.tta_logits(result['net'], self.test_split['images'], hyp).half()
            labels = self.test_split['labels']
            record['test_acc'] = (logits.argmax(1) == labels).float().mean().item()
            if args.save_logits:
                outputs['logits'] = logits.cpu()
        if args.train_subset is not None:
            outputs['train_mask'] = mask
        record.update(rank=self.world.rank, host=socket.gethostname(), device=str(self.device),
                      launch=self.launch,
                      finished=datetime.datetime.now(datetime.timezone.utc).isoformat())
        buffer = io.BytesIO()
        if outputs:
            torch.save(outputs, buffer)
        return record, buffer.getvalue() or None


# ------------------------------------ Environment and setup --------------------------------------
def cpu_model():
    if platform.processor() not in ('', platform.machine()):
        return platform.processor()
    try:
        with open('/proc/cpuinfo') as f:
            for line in f:
                if line.startswith('model name'):
                    return line.partition(':')[2].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def nvidia_driver():
    try:
        query = ['nvidia-smi', '--query-gpu=driver_version', '--format=csv,noheader']
        output = subprocess.run(query, capture_output=True, text=True, timeout=30).stdout.split()
        return output[0] if output else None
    except (OSError, subprocess.SubprocessError):
        return None


def local_environment(device, precision):
    info = dict(host=socket.gethostname(), cpu=cpu_model(), torch=torch.__version__,
                python=platform.python_version(), device=device.type, precision=precision)
    if device.type == 'cuda':
        info.update(gpu=torch.cuda.get_device_name(device), cuda=torch.version.cuda,
                    driver=nvidia_driver())
    return info


def world_environment(infos):
    """The launch's environment from every process's: GPU models with their counts, hosts, ..."""
    def values(key):
        found = sorted({str(info[key]) for info in infos if info.get(key) is not None})
        return ', '.join(found) or None

    gpus = {}
    for info in infos:
        if info.get('gpu'):
            gpus[info['gpu']] = gpus.get(info['gpu'], 0) + 1
    return dict(world_size=len(infos), hosts=values('host'), gpus=gpus or None,
                gpu_count=sum(gpus.values()), driver=values('driver'), cuda=values('cuda'),
                torch=values('torch'), cpu=values('cpu'), python=values('python'),
                device=values('device'), precision=values('precision'))


def make_plan(args, settings, infos, command):
    """Rank 0: refuse a process's error, a world that disagrees or a study directory in the way;
    else lock DIR and list the runs to train. Returns the lock and the plan."""
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
    lock = open_study(args.study_dir, settings, args.runs, command)
    try:
        if args.val_split:
            held_out = validation_indices(settings['data']['num_train'], args.val_split, args.seed)
            atomic_write(os.path.join(args.study_dir, 'validation.json'),
                         json.dumps({'seed': args.seed, 'indices': held_out.tolist()}))
        finished = read_records(args.study_dir, args.configs, args.runs)
    except BaseException:
        lock.close()
        raise
    # run-major: the runs of a seed finish together, so that a partial study is paired
    jobs = [[config, run] for run in range(args.runs) for config in args.configs
            if (config, run) not in finished]
    total = len(args.configs) * args.runs
    return lock, dict(launch=uuid.uuid4().hex[:12], jobs=jobs, total=total,
                      finished=total - len(jobs), environment=world_environment(infos))


# -------------------------------------------- Study ----------------------------------------------
def setup_process(args, world):
    """This process's script, flags, hyps, device, precision and data, and what it tells rank 0:
    its environment and data fingerprint (or the error that stops the study)."""
    script = load_script(args.script)
    script_args = parse_script_flags(script, args.script_flags)
    try:
        script.study_hyp(script_args)
    except ValueError as error:
        raise StudyError(f'the flags after --: {error}') from None
    hyps = config_hyps(script, script_args, args.configs)
    try:
        device, precision = script.resolve_device_precision(script_args.device,
                                                            script_args.precision)
        data = script.load_dataset(script_args.dataset, script_args.data_dir,
                                   script_args.train_splits.split(','),
                                   log=print if world.local_rank == 0 else lambda *_: None)
    except (ValueError, script.DataError) as error:
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
    return argparse.Namespace(script=script, script_args=script_args, hyps=hyps, device=device,
                              precision=precision, data=data, info=info)


def study_settings(args, process):
    """What the study is (study.json without its runs): a command that differs is refused."""
    with open(os.path.join(REPO, f'{args.script}.py'), 'rb') as f:
        script_sha256 = hashlib.sha256(f.read()).hexdigest()
    data = process.data
    return json.loads(json.dumps(dict(  # as JSON holds them, to compare with DIR's
        script=args.script, script_sha256=script_sha256,
        configs=[[name, *overrides] for name, overrides in args.configs.items()],
        hyps=process.hyps, seed=args.seed, vary=args.vary, train_subset=args.train_subset,
        val_split=args.val_split, save_logits=args.save_logits, precision=process.precision,
        data=dict(dataset=process.script_args.dataset,
                  train_splits=process.script_args.train_splits, sha256=process.info['data'],
                  num_train=len(data['train']['labels']), num_test=len(data['test']['labels']),
                  classes=list(data['classes'])))))


def run_study(args, world, command):
    # Setup: one process per machine first (a download, the tensor cache), then the others
    process = None
    try:
        if world.local_rank != 0:
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
            infos = world.read_all('info')
            settings = None if process is None else study_settings(args, process)
            lock, plan = make_plan(args, settings, infos, command)
        except StudyError as error:
            plan = {'error': str(error)}
        world.publish('plan', plan)
    plan = world.read('plan')
    if 'error' in plan:
        raise StudyError(plan['error'])

    script, device = process.script, process.device
    if device.type == 'cuda':
        torch.cuda.set_device(device)
    torch.backends.cudnn.benchmark = not process.script_args.deterministic
    if process.script_args.deterministic:
        os.environ.setdefault('CUBLAS_WORKSPACE_CONFIG', ':4096:8')
        torch.use_deterministic_algorithms(True)
    script.keep_freed_memory_in_process()  # for the CPU's training steps; harmless beside a GPU
    runner = Runner(args, process, world, plan['launch'])
    heartbeat, collector = Heartbeat(world), None
    heartbeat.start()
    if world.rank == 0:
        print(f"{args.script} study in {args.study_dir}: {plan['finished']} of {plan['total']} "
              f"runs finished, {len(plan['jobs'])} to train; world size {world.size} on "
              f"{plan['environment']['hosts']} ({device.type}, {process.precision})", flush=True)
        collector = Collector(world, plan, args.study_dir, args.lost_after)
        collector.start()
    try:
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
                write_outputs(args, plan['environment'])
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


# ------------------------------------------ Statistics -------------------------------------------
def finite_or_none(value):
    """scipy's nan (as for samples without spread) as None, which JSON holds."""
    return float(value) if math.isfinite(value) else None


def summarize(records, args, environment):
    """summary.json's content: per configuration n, mean, std, 95% CI and the one-sided test of the
    mean against --target; each configuration against the first: the difference of means with its
    (Welch) 95% CI, Welch's t-test, and the paired t-test over the runs both finished."""
    from scipy import stats
    accuracies = {config: {run: record['accuracy'] for (c, run), record in sorted(records.items())
                           if c == config} for config in args.configs}
    configs = {}
    with warnings.catch_warnings():  # samples without spread: scipy warns and gives nan (None)
        warnings.simplefilter('ignore', RuntimeWarning)
        for config, by_run in accuracies.items():
            values, n = list(by_run.values()), len(by_run)
            times = [r['total_time_seconds'] for (c, _), r in records.items() if c == config]
            entry = dict(n=n, mean=None, std=None, ci95=None, p_above_target=None,
                         mean_time_seconds=None)
            if n:
                mean = float(stats.tmean(values))
                entry.update(mean=mean, mean_time_seconds=float(stats.tmean(times)))
            if n > 1:
                interval = stats.t.interval(0.95, n - 1, loc=mean, scale=stats.sem(values))
                entry.update(std=finite_or_none(stats.tstd(values)),
                             ci95=[finite_or_none(bound) for bound in interval])
                if None in entry['ci95']:
                    entry['ci95'] = None
                if args.target is not None:
                    entry['p_above_target'] = finite_or_none(stats.ttest_1samp(
                        values, args.target, alternative='greater').pvalue)
            configs[config] = entry
        comparisons = []
        baseline, *others = args.configs
        for config in others:
            ours, theirs = accuracies[config], accuracies[baseline]
            shared = sorted(set(ours) & set(theirs))
            entry = dict(config=config, baseline=baseline, difference=None, ci95=None,
                         p_welch=None, p_paired=None, n_paired=len(shared))
            if ours and theirs:
                entry['difference'] = configs[config]['mean'] - configs[baseline]['mean']
            if len(ours) > 1 and len(theirs) > 1:
                welch = stats.ttest_ind(list(ours.values()), list(theirs.values()),
                                        equal_var=False)
                interval = welch.confidence_interval(0.95)
                ci95 = [finite_or_none(interval.low), finite_or_none(interval.high)]
                entry.update(ci95=None if None in ci95 else ci95,
                             p_welch=finite_or_none(welch.pvalue))
            if len(shared) > 1:
                entry['p_paired'] = finite_or_none(stats.ttest_rel(
                    [ours[run] for run in shared], [theirs[run] for run in shared]).pvalue)
            comparisons.append(entry)
    finished = sum(entry['n'] for entry in configs.values())
    return dict(script=args.script,
                status='complete' if finished == len(configs) * args.runs else 'partial',
                runs_requested=args.runs, runs_finished=finished, seed=args.seed, vary=args.vary,
                target=args.target, accuracy_on='validation' if args.val_split else 'test',
                configs=configs, comparisons=comparisons, environment=environment)


def write_outputs(args, environment):
    """summary.json, report.md and the plots, from the records in DIR."""
    records = read_records(args.study_dir, args.configs, args.runs)
    summary = summarize(records, args, environment)
    atomic_write(os.path.join(args.study_dir, 'summary.json'), json.dumps(summary, indent=2))

    def fmt(value, digits=4):
        return '' if value is None else f'{value:.{digits}f}'

    def interval(ci95):
        return '' if ci95 is None else f'[{fmt(ci95[0])}, {fmt(ci95[1])}]'

    lines = [f"# Study of {summary['script']}: {summary['accuracy_on']} accuracy with TTA", '',
             f"{summary['runs_finished']} of {len(args.configs) * args.runs} runs finished "
             f"({summary['status']}); seeds from {args.seed}, varying {args.vary}.", '',
             '| configuration | n | mean | std | 95% CI | p(mean > target) | mean timed seconds |',
             '|---|---|---|---|---|---|---|']
    for name, c in summary['configs'].items():
        lines.append(f"| {name} | {c['n']} | {fmt(c['mean'])} | {fmt(c['std'])} | "
                     f"{interval(c['ci95'])} | {fmt(c['p_above_target'], 3)} | "
                     f"{fmt(c['mean_time_seconds'], 2)} |")
    if summary['target'] is not None:
        lines += ['', f"Target {summary['target']}: one-sided t-test that the mean exceeds it."]
    if summary['comparisons']:
        lines += ['', '| configuration | baseline | difference | 95% CI (Welch) | p (Welch) | '
                  'p (paired) | pairs |', '|---|---|---|---|---|---|---|']
        for c in summary['comparisons']:
            lines.append(f"| {c['config']} | {c['baseline']} | {fmt(c['difference'])} | "
                         f"{interval(c['ci95'])} | {fmt(c['p_welch'], 3)} | "
                         f"{fmt(c['p_paired'], 3)} | {c['n_paired']} |")
    lines += ['', '## Environment (this launch)', '']
    lines += [f'- {key}: {value}' for key, value in summary['environment'].items()]
    lines += ['', '![accuracy](accuracy.png) ![time](time.png)']
    atomic_write(os.path.join(args.study_dir, 'report.md'), '\n'.join(lines) + '\n')
    plot(args.study_dir, summary, records)


def plot(study_dir, summary, records):
    """Each configuration's accuracies (points, with the mean and its 95% CI) and timed seconds."""
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    names = list(summary['configs'])
    for key, label, filename in (
            ('accuracy', f"{summary['accuracy_on']} accuracy (TTA)", 'accuracy.png'),
            ('total_time_seconds', 'timed seconds per run', 'time.png')):
        figure, axes = plt.subplots(figsize=(2 + 1.4 * len(names), 4))
        for x, name in enumerate(names):
            values = [r[key] for (config, _), r in sorted(records.items()) if config == name]
            axes.scatter([x] * len(values), values, alpha=0.5, s=14)
            config = summary['configs'][name]
            if key == 'accuracy' and config['ci95'] is not None:
                low, high = config['ci95']
                axes.errorbar([x + 0.15], [config['mean']], color='black', capsize=4, fmt='o',
                              yerr=[[config['mean'] - low], [high - config['mean']]])
        axes.set_xticks(range(len(names)), names)
        axes.set_ylabel(label)
        axes.set_title(f"{summary['script']}: {label}"
                       + (' (mean, 95% CI)' if key == 'accuracy' else ''))
        figure.tight_layout()
        figure.savefig(os.path.join(study_dir, filename), dpi=120)
        plt.close(figure)


# --------------------------------------------- Main ----------------------------------------------
def raise_stopped(signal_number, frame):
    raise Stopped()


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
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


if __name__ == '__main__':
    sys.exit(main())
