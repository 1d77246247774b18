"""A self-check of this machine in one command: every script trains one short run, then a study of
two compiled configurations in one process, then the same study in two processes under torchrun;
one line per item says whether it passed, its seconds and the first line of its error. Run it after
installing on a new GPU machine, or after changing torch.

Usage: python tools/gpu_check.py [--data-dir DIR] [--device auto|cpu|cuda|cuda:N]
                                 [--only ITEM,...] [--timeout SECONDS] [--keep DIR] [--tiny]

The items, in this order (--only names some): the eager scripts (airbench94, airbench95,
airbench96_faster, airbench96), each `python SCRIPT.py --runs 1 --seed 0 --epochs 4`, then the
compiled ones (airbench94_compiled, airbench94_muon, airbench94_hiverge), whose CUDA warmup
compiles every graph a default run needs (4 epochs pass the whitening bias's freeze); then `study`,
`python study.py airbench94_hiverge --runs 2 --config hiverge --config muon airbench94_muon` in one
process, and `study-torchrun`, the same under `torchrun --standalone --nproc_per_node=2` (a GPU per
process with two or more, both on GPU 0 with one). The cheap items come first and airbench94 first
of all: in seconds it checks the data, the device, torch and the code every script shares. The
compiled scripts' warmups fill inductor's cache, so the studies' warmups load their graphs and
check the engine, not the compiler, a second time.

On a CPU (or with --tiny on CUDA) the items train tiny networks (TINY_WIDTHS, airbench96_faster's
proxy too) in batches of 32 for one epoch, a script as a user who edited its hyp (MAIN_WITH_HYP:
its main() with the entries set), a study with `--hyp` after its `--`.

Before the items, a line names the device, torch and the GPUs, and one says whether inductor's
cache is empty (every compile cold: minutes per compiled script on a GPU). Then a line per item:

    passed  airbench94_hiverge.py    212.4 s  warmup 190.3 s; compiled cold: 37 new cache files
    failed  study.py, 1 process        3.1 s  ValueError: Expected a torch.device with a ...

with, for a script, its warmup's seconds, for a study its runs, devices and ranks, whether it
compiled anew or from the cache, and for a failure the first line of its error (its `error:` line,
else the last exception of its traceback, else how it ended, or its timeout). An item passes when it
exits 0 having written what it should (a script its log with its run; a study every run and its
summary). Exit status 0 when every item passed, 1 otherwise, 2 for bad input. Each item runs in a
directory of its own (stdout.txt, stderr.txt, its log or study), temporary or --keep DIR; nothing is
written into the repository.
"""
import argparse
import glob
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import torch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
from studylib.scripts import repository_tail  # noqa: E402
STUDY = os.path.join(REPO, 'study.py')
EAGER = ['airbench94', 'airbench95', 'airbench96_faster', 'airbench96']
COMPILED = ['airbench94_compiled', 'airbench94_muon', 'airbench94_hiverge']  # on CUDA
SCRIPTS = EAGER + COMPILED
STUDIES = ['study', 'study-torchrun']
ITEMS = SCRIPTS + STUDIES
LABELS = {**{name: f'{name}.py' for name in SCRIPTS}, 'study': 'study.py, 1 process',
          'study-torchrun': 'study.py, 2 processes'}
STUDY_RUNS = 2  # per configuration
CONFIGS = ['--config', 'hiverge', '--config', 'muon', 'airbench94_muon']
# The networks of a check of training, not of accuracy (the tests' too): the paper's shape, block2
# the wider
TINY_WIDTHS = {'block1': 8, 'block2': 16, 'block3': 16}
# A script's main() with hyp entries set first (sys.argv[2], JSON), then its flags: a tiny item, as
# a user who edited hyp runs it (studylib's loader and setter)
MAIN_WITH_HYP = f"""import json, sys
sys.path.insert(0, {REPO!r})
from studylib.hyp import with_entries
from studylib.scripts import load_script
script = load_script(sys.argv[1])
script.hyp = with_entries(script.hyp, json.loads(sys.argv[2]))
sys.exit(script.main(sys.argv[3:]))
"""
TORCHRUN_VARIABLES = ('RANK', 'LOCAL_RANK', 'WORLD_SIZE', 'LOCAL_WORLD_SIZE', 'GROUP_RANK',
                      'ROLE_RANK', 'ROLE_WORLD_SIZE', 'MASTER_ADDR', 'MASTER_PORT')
LONGEST_MESSAGE = 500  # characters of an error's first line, at most
STOP_GRACE_SECONDS = 10  # between SIGTERM and SIGKILL for an item that timed out


class Parser(argparse.ArgumentParser):
    def error(self, message):  # bad input: one line, not the usage text
        self.exit(2, f'error: {message}\n')


def parse_args(argv):
    parser = Parser(description=' '.join(__doc__.split('\n\n')[0].split()))
    parser.add_argument('--data-dir', default='data/cifar10', help="the scripts' --data-dir: "
                        'CIFAR-10 (downloaded there when absent) or an image folder')
    parser.add_argument('--device', default='auto', help='auto (CUDA where torch sees it), cpu, '
                        'cuda (the torchrun study: a GPU per process) or cuda:N (every item on '
                        'GPU N)')
    parser.add_argument('--only', metavar='ITEM,...', help='comma-separated, of '
                        f'{", ".join(ITEMS)}')
    parser.add_argument('--timeout', type=float, default=600, metavar='SECONDS',
                        help='per item (default 600)')
    parser.add_argument('--keep', metavar='DIR', help="keep each item's output there (a new or "
                        'empty directory)')
    parser.add_argument('--tiny', action='store_true', help="the CPU's tiny settings on CUDA too "
                        '(for a small image folder)')
    args = parser.parse_args(argv)
    try:
        args.items = selected(args.only)
        args.devices = devices(args.device, torch.cuda.device_count())
        check_keep(args.keep)
        if not args.timeout > 0:
            raise ValueError(f'--timeout takes seconds above 0, not {args.timeout:g}')
    except ValueError as error:
        parser.error(str(error))
    return args


def selected(only):
    """The items --only names (a script's with or without .py), in the order of ITEMS; None: all."""
    if only is None:
        return list(ITEMS)
    names = [name.strip() for name in only.split(',') if name.strip()]
    names = [name[:-3] if name.endswith('.py') else name for name in names]
    unknown = [name for name in names if name not in ITEMS]
    if unknown or not names:
        problem = f'no item {", ".join(unknown)}' if unknown else 'names no item'
        raise ValueError(f'--only {only!r}: {problem}; choose from {", ".join(ITEMS)}')
    return [name for name in ITEMS if name in names]


def devices(requested, gpus):
    """(the device of the scripts and the one-process study, that of the torchrun study) for
    --device on a machine where torch sees this many GPUs; ValueError for one it lacks."""
    if requested == 'cpu' or requested == 'auto' and gpus == 0:
        return 'cpu', 'cpu'
    if requested in ('auto', 'cuda'):
        if gpus == 0:
            raise ValueError(f'--device cuda: torch {torch.__version__} sees no CUDA device here; '
                             'use --device cpu or auto')
        return 'cuda', 'cuda' if gpus >= 2 else 'cuda:0'
    kind, _, index = requested.partition(':')
    if not (kind == 'cuda' and index.isdigit()):
        raise ValueError(f'--device {requested}: give auto, cpu, cuda or cuda:N')
    if int(index) >= gpus:
        raise ValueError(f'--device {requested}: torch {torch.__version__} sees {gpus} CUDA '
                         f'device{"s" * (gpus != 1)} here')
    return requested, requested


def check_keep(keep):
    """--keep DIR must be new or empty: a study found there would be continued, not run."""
    if keep and os.path.exists(keep) and (not os.path.isdir(keep) or os.listdir(keep)):
        raise ValueError(f'--keep {keep}: give a new or empty directory (a study already there '
                         'would be continued rather than run)')


def tiny_hyp(script):
    """The hyp entries of a short training of script: tiny networks (its proxy's too) in batches
    of 32."""
    widths = {'net.widths': TINY_WIDTHS}
    if script == 'airbench96_faster':
        widths['proxy.widths'] = TINY_WIDTHS
    return {'opt.batch_size': 32, **widths}


def item_hyp(device, tiny, script=None):
    """An item's hyp entries: tiny_hyp where the settings are tiny (always on a CPU), else none."""
    return tiny_hyp(script) if tiny or device == 'cpu' else {}


def training_flags(device):
    """A short training's flags: 4 epochs on CUDA (past the whitening bias's freeze), 1 on a CPU."""
    return ['--device', device, '--epochs', '1' if device == 'cpu' else '4']


def script_command(name, device, data_dir, item_dir, tiny):
    """The script as a user runs it; with tiny settings, its main() on its module with those
    entries of hyp set, as a user who edited them (the scripts take no --hyp)."""
    path = os.path.join(REPO, f'{name}.py')
    settings = item_hyp(device, tiny, name)
    program = [path] if not settings else ['-c', MAIN_WITH_HYP, path, json.dumps(settings)]
    return [sys.executable, *program, '--runs', '1', '--seed', '0', '--data-dir', data_dir,
            '--log-dir', os.path.join(item_dir, 'logs'), *training_flags(device)]


def study_command(launcher, device, data_dir, item_dir, tiny):
    folder = ['--dataset', 'folder'] * (repository_tail().image_folder_error(data_dir) is None)
    hyp = [word for key, value in item_hyp(device, tiny).items()
           for word in ('--hyp', f'{key}={value!r}')]
    return [*launcher, STUDY, 'airbench94_hiverge', '--runs', str(STUDY_RUNS),
            '--study-dir', os.path.join(item_dir, 'study'), *CONFIGS, '--',
            *folder, '--data-dir', data_dir, *training_flags(device), *hyp]


def commands(names, devices, data_dir, work_dir, tiny):
    """{item: its command line}, in the order of names; each item works in work_dir/ITEM."""
    single, shared = devices
    torchrun = [sys.executable, '-m', 'torch.distributed.run', '--standalone',
                '--nproc_per_node=2']
    made = {}
    for name in names:
        item_dir = os.path.join(work_dir, name)
        made[name] = script_command(name, single, data_dir, item_dir, tiny) if name in SCRIPTS \
            else study_command([sys.executable] if name == 'study' else torchrun,
                               single if name == 'study' else shared, data_dir, item_dir, tiny)
    return made


def compiles(name, device):
    """Whether the item compiles with inductor: the compiled scripts and the studies (of two of
    them) on CUDA; airbench94_compiled alone on a CPU, where the Muon scripts run eagerly."""
    return name == 'airbench94_compiled' or device != 'cpu' and name in COMPILED + STUDIES


def inductor_cache_dir():
    """Where inductor keeps what it compiles, as torch computes it (TORCHINDUCTOR_CACHE_DIR, else
    /tmp/torchinductor_USER), created if absent; torch 2.4 has the function elsewhere."""
    try:
        from torch._inductor.runtime.cache_dir_utils import cache_dir
    except ImportError:
        from torch._inductor.runtime.runtime_utils import cache_dir
    return cache_dir()


def cache_files(directory):
    """The files of inductor's cache (paths relative to it), its lock files left out: what
    compiling wrote there."""
    found = set()
    for root, subdirectories, files in os.walk(directory):
        subdirectories[:] = [d for d in subdirectories if d != 'locks']
        found |= {os.path.relpath(os.path.join(root, f), directory) for f in files
                  if not f.endswith('.lock')}
    return found


def cache_state(directory, files):
    """The line said before the items: is inductor's cache empty (every compile cold)?"""
    if not files:
        return (f'inductor cache {directory}: empty, so every compile is cold (minutes per '
                'compiled script on a GPU: 55 to 200 s on an H100)')
    return (f'inductor cache {directory}: {len(files)} files, so a graph compiled before by '
            'this torch loads from it (a line says "compiled cold" where an item compiled anew)')


def compile_note(new_files, compiling):
    if new_files:
        return f'compiled cold: {new_files} new cache files'
    return 'compiled from the cache' if compiling else ''


def error_line(text):
    """The first `error: ...` line (the scripts' and study.py's message for bad input), or None."""
    return next((line.strip() for line in text.splitlines() if line.startswith('error: ')), None)


def exception_line(text):
    """The first line of the last exception of the tracebacks in text that is not torchrun's own
    (its ChildFailedError follows a worker's traceback), or None."""
    lines = text.splitlines()
    found = []
    for i, line in enumerate(lines):
        if line.startswith('Traceback (most recent call last):'):
            found += [next((after for after in lines[i + 1:] if after and not after[0].isspace()),
                           None)]
    found = [line.strip() for line in found if line and 'ChildFailedError' not in line]
    return found[-1] if found else None


def launcher_failure(text):
    """torchrun's root cause, for a worker that ended without a traceback (killed), or None."""
    _, found, cause = text.partition('Root Cause (first observed failure):')
    fields = {}
    for line in cause.splitlines():
        key, colon, value = line.partition(':')
        fields.setdefault(key.strip(), ' '.join(value.split()) if colon else None)
    if not found or not fields.get('rank') or not fields.get('exitcode'):
        return None
    return f'torchrun: rank {fields["rank"]} ended with exit code {fields["exitcode"]}'


def exit_description(status):
    if status < 0:
        return f'killed by {signal.Signals(-status).name}'
    return f'exit status {status}, and no error message'


def first_error_line(status, stdout, stderr, timeout):
    """What an item's line says of its failure: a timeout; its `error:` line (on stderr, or on
    stdout for a run that diverged); the last exception of its traceback; how it ended."""
    if status is None:
        return f'timed out after {timeout:g} s'
    line = error_line(stderr) or error_line(stdout) or exception_line(stderr) or \
        launcher_failure(stderr) or exit_description(status)
    return line if len(line) <= LONGEST_MESSAGE else line[:LONGEST_MESSAGE - 3] + '...'


def script_outcome(item_dir):
    """(what went wrong or None, the detail): a script's log must hold its one finished run."""
    logs = glob.glob(os.path.join(item_dir, 'logs', '*', 'summary.json'))
    if len(logs) != 1:
        return f'exit status 0, but {len(logs)} logs where one', ''
    with open(logs[0]) as f:
        log = json.load(f)
    detail = f'warmup {log["warmup_seconds"]:.1f} s' if 'warmup_seconds' in log else ''
    if log.get('status') != 'finished' or log.get('runs_finished') != 1:
        return f'exit status 0, but its log says {log.get("status")} with ' \
               f'{log.get("runs_finished")} runs', detail
    return None, detail


def study_outcome(item_dir):
    """(what went wrong or None, the detail): a study must be complete, every run recorded."""
    study_dir = os.path.join(item_dir, 'study')
    expected = 2 * STUDY_RUNS
    records = []
    for path in glob.glob(os.path.join(study_dir, 'runs', '*', '*.json')):
        if not path.endswith('.failed.json'):
            with open(path) as f:
                records.append(json.load(f))
    try:
        with open(os.path.join(study_dir, 'summary.json')) as f:
            status = json.load(f).get('status')
    except (OSError, ValueError):
        status = 'missing'
    detail = f'{len(records)} runs on {", ".join(sorted({r["device"] for r in records}))} by ' \
             f'rank {", ".join(str(rank) for rank in sorted({r["rank"] for r in records}))}' \
        if records else ''
    timed = sum(record.get('graphs_compiled_during_run', 0) for record in records)
    detail += f'; {timed} graphs compiled while timed' if timed else ''
    if status != 'complete' or len(records) != expected:
        return f'exit status 0, but its summary is {status} with {len(records)} of {expected} ' \
               'runs recorded', detail
    return None, detail


def item_environment():
    """This environment without a torchrun process's variables (the items launch their own),
    output unbuffered (all of it kept when an item is stopped)."""
    return {**{key: value for key, value in os.environ.items()
               if key not in TORCHRUN_VARIABLES and not key.startswith('TORCHELASTIC_')},
            'PYTHONUNBUFFERED': '1'}


def stop(process):
    """SIGTERM to the item's process group (torchrun and its workers), then SIGKILL."""
    for sig, grace in ((signal.SIGTERM, STOP_GRACE_SECONDS), (signal.SIGKILL, None)):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            return
        try:
            process.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            pass


def run_item(command, item_dir, timeout):
    """(exit status, None if it timed out; stdout; stderr): the command in item_dir, in a process
    group of its own, its output kept there."""
    os.makedirs(item_dir, exist_ok=True)
    paths = [os.path.join(item_dir, name) for name in ('stdout.txt', 'stderr.txt')]
    with open(paths[0], 'w') as stdout, open(paths[1], 'w') as stderr:
        process = subprocess.Popen(command, cwd=item_dir, stdout=stdout, stderr=stderr,
                                   env=item_environment(), start_new_session=True)
        try:
            status = process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            status = None
            stop(process)
        except BaseException:  # Ctrl-C: the item, in its own session, did not receive it
            stop(process)
            raise
    outputs = []
    for path in paths:
        with open(path, errors='replace') as f:
            outputs.append(f.read())
    return status, *outputs


def item_line(passed, name, seconds, details):
    """passed or failed, the item, its seconds, and its details that say something."""
    width = max(len(label) for label in LABELS.values())
    line = f'{"passed" if passed else "failed"}  {LABELS[name]:<{width}}  {seconds:6.1f} s'
    said = '; '.join(detail for detail in details if detail)
    return f'{line}  {said}' if said else line


def check_item(name, command, item_dir, args, cache):
    """Run one item and return its line and whether it passed."""
    before = cache_files(cache)
    start = time.monotonic()
    status, stdout, stderr = run_item(command, item_dir, args.timeout)
    seconds = time.monotonic() - start
    new_files = len(cache_files(cache) - before)
    if status == 0:
        problem, detail = (script_outcome if name in SCRIPTS else study_outcome)(item_dir)
    else:
        problem = first_error_line(status, stdout, stderr, args.timeout)
        detail = ''
    details = [problem, detail, compile_note(new_files, compiles(name, args.devices[0]))]
    return item_line(problem is None, name, seconds, details), problem is None


def device_line(device, tiny, data_dir):
    """The first line: the device, torch, the GPUs, the settings and the data."""
    gpus = torch.cuda.device_count() if device != 'cpu' else 0
    names = sorted({torch.cuda.get_device_name(i) for i in range(gpus)})
    where = f'{gpus} GPU{"s" * (gpus > 1)}: {", ".join(names)}' if gpus else \
        'no GPU used' if torch.cuda.is_available() else 'torch sees no GPU'
    settings = 'tiny settings' if tiny or device == 'cpu' else 'full networks'
    layout = 'an image folder' if repository_tail().image_folder_error(data_dir) is None else \
        "CIFAR-10's layout"
    return (f'device {device} ({where}), torch {torch.__version__}, {settings}; data {data_dir} '
            f'({layout})')


def run_checks(args, work_dir):
    """Print the header and each item's line; the number of items that passed."""
    data_dir = os.path.abspath(args.data_dir)
    print(device_line(args.devices[0], args.tiny, data_dir), flush=True)
    cache = inductor_cache_dir()
    print(cache_state(cache, cache_files(cache)), flush=True)
    passed = 0
    for name, command in commands(args.items, args.devices, data_dir, work_dir, args.tiny).items():
        line, ok = check_item(name, command, os.path.join(work_dir, name), args, cache)
        print(line, flush=True)
        passed += ok
    return passed


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    start = time.monotonic()
    work_dir = os.path.abspath(args.keep) if args.keep else tempfile.mkdtemp(prefix='gpu_check_')
    os.makedirs(work_dir, exist_ok=True)
    try:
        passed = run_checks(args, work_dir)
    except KeyboardInterrupt:
        print('interrupted', flush=True)
        return 130
    finally:
        if not args.keep:
            shutil.rmtree(work_dir, ignore_errors=True)
    total = len(args.items)
    kept = f'; outputs in {work_dir}' if args.keep else \
        '; --keep DIR keeps every output' if passed < total else ''
    print(f'{passed} of {total} passed in {time.monotonic() - start:.1f} s{kept}', flush=True)
    return 0 if passed == total else 1


if __name__ == '__main__':
    sys.exit(main())
