"""The tiers (docs/tests.md), the scripts under test, small datasets, and running a script as a
user does. The repository and tools/ go on the path, so that tests import them by name."""
import json
import os
import socket
import subprocess
import sys
import threading

import pytest
import torch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [REPO, os.path.join(REPO, 'tools')]
TIERS = ('quick', 'slow', 'all')

from gpu_check import MAIN_WITH_HYP, TINY_WIDTHS, tiny_hyp  # noqa: E402, F401
from studylib.cli import parse_flags  # noqa: E402
from studylib.hyp import config_hyp, with_entries  # noqa: E402
from studylib.scripts import load_script  # noqa: E402


def pytest_addoption(parser):
    parser.addoption('--tier', choices=TIERS, default='quick', help=(
        'quick (the default): all but the tests marked slow (processes, real data, compilation, '
        'simulations at length); slow: those; all: both, as CI runs them (docs/tests.md)'))


def pytest_configure(config):
    config.addinivalue_line('markers', 'slow: starts processes, trains on real data, compiles '
                            'with inductor or simulates at length: run by --tier slow or all')


def pytest_collection_modifyitems(config, items):
    tier = config.getoption('--tier')
    if tier == 'all':
        return
    slow = [item.get_closest_marker('slow') is not None for item in items]
    config.hook.pytest_deselected(items=[item for item, s in zip(items, slow)
                                         if s != (tier == 'slow')])
    items[:] = [item for item, s in zip(items, slow) if s == (tier == 'slow')]


# The quick tier starts no process: the audit events that start one, inductor's compiler included
PROCESS_EVENTS = {'subprocess.Popen', 'os.system', 'os.fork', 'os.forkpty', 'os.posix_spawn',
                  'os.exec', 'os.spawn'}
# platform.processor(), a GPU's name, torch 2.4's pool of compile workers (later versions compile
# in this process), and the font list that matplotlib reads once to build its font cache
HARMLESS_PROGRAMS = {'uname', 'nvidia-smi', 'inductor compile worker', 'fc-list'}
STARTED_PROCESSES = []  # (event, program), program '' for a fork


def record_process_start(event, args):
    if event not in PROCESS_EVENTS:
        return
    command = args[1] if event in ('subprocess.Popen', 'os.spawn') else args[0] if args else ''
    if isinstance(command, str):
        command = command.split()
    elif isinstance(command, (bytes, os.PathLike)):
        command = [command]
    words = [os.fsdecode(word) for word in command] if isinstance(command, (list, tuple)) else []
    program = 'inductor compile worker' if any('compile_worker' in w for w in words) else \
        os.path.basename(words[0]) if words else ''
    STARTED_PROCESSES.append((event, program))


sys.addaudithook(record_process_start)


def unexpected_processes(started):
    return [(event, program) for event, program in started if program not in HARMLESS_PROGRAMS]


@pytest.fixture(autouse=True)
def quick_tests_start_no_process(request):
    before = len(STARTED_PROCESSES)
    yield
    started = unexpected_processes(STARTED_PROCESSES[before:])
    if started and request.node.get_closest_marker('slow') is None:
        pytest.fail(f'a test not marked slow started processes: {started}; mark it '
                    '@pytest.mark.slow (docs/tests.md, "Tiers")')


@pytest.fixture(autouse=True)
def no_heartbeat_left_running():
    """A study's heartbeat left running aborts the interpreter at exit, after every test passed."""
    yield
    from studylib.distribute import Heartbeat
    running = [thread for thread in threading.enumerate() if isinstance(thread, Heartbeat)]
    if running:
        pytest.fail(f'{len(running)} study heartbeat thread(s) still running after the test')


PAPER_SCRIPTS = ['airbench94', 'airbench94_compiled', 'airbench95', 'airbench96']
SCRIPTS = [*PAPER_SCRIPTS, 'airbench94_muon', 'airbench94_hiverge']
ALL_SCRIPTS = [*SCRIPTS, 'airbench96_faster']
CPU = torch.device('cpu')

# The scripts take no --hyp: a test runs one as a user who edited hyp does, its entries
# ('GROUP.NAME': value) set on the module (set_hyp) or in its process (run_script's hyp).
# On write_image_folder's 384 training images: batches of 64, 4 epochs
QUICK_HYP = {'opt.batch_size': 64}
QUICK = ['--epochs', '4', '--device', 'cpu']


def set_hyp(monkeypatch, script, *settings):
    """main() runs with these entries ({'GROUP.NAME': value}, a later one winning)."""
    merged = {key: value for entries in settings for key, value in entries.items()}
    monkeypatch.setattr(script, 'hyp', with_entries(script.hyp, merged))


def study_hyp(script, settings, hyp=None):
    """The hyp that study.py trains for `-- --hyp SETTING ...`, checked by the script's rules."""
    flags = [word for setting in settings for word in ('--hyp', setting)]
    return config_hyp(script.hyp if hyp is None else hyp, script.HYP_CHOICES, script.HYP_RANGES,
                      parse_flags(flags))


def marked_slow(slow, names=ALL_SCRIPTS):
    """names as parameters, those in slow in the slow tier: code that another runs in the quick."""
    return [pytest.param(name, marks=pytest.mark.slow) if name in slow else name for name in names]


@pytest.fixture(params=PAPER_SCRIPTS)
def paper_script(request):
    return load_script(request.param)


@pytest.fixture
def ab94():
    return load_script('airbench94')


def quick_train(script, data, seed=0, net=None, entries=None):
    """train() of a network of TINY_WIDTHS, batches of 32, 4 epochs, unless entries say other."""
    hyp = with_entries(script.hyp, {'opt.batch_size': 32, 'opt.train_epochs': 4,
                                    'net.widths': TINY_WIDTHS, **(entries or {})})
    return script.train(data, hyp, CPU, 'fp32', seed, net=net, epoch_eval=False)


def spy(monkeypatch, owner, name):
    """The arguments of each call of owner.name, which still does its work."""
    calls = []
    original = getattr(owner, name)

    def recorded(*args, **kwargs):
        calls.append(args)
        return original(*args, **kwargs)
    monkeypatch.setattr(owner, name, recorded)
    return calls


def write_image_folder(root, num_classes=4, train_per_class=96, test_per_class=32, size=32, seed=0,
                       extension='.png'):
    """An image folder a network learns in a few steps: each class its colour and stripe."""
    from PIL import Image
    generator = torch.Generator().manual_seed(seed)
    colours = torch.rand(num_classes, 3, generator=generator) * 160 + 48
    for split, per_class in (('train', train_per_class), ('test', test_per_class)):
        for label in range(num_classes):
            class_dir = os.path.join(root, split, f'class_{label}')
            os.makedirs(class_dir, exist_ok=True)
            for i in range(per_class):
                noise = 40 * torch.randn(size, size, 3, generator=generator)
                image = colours[label].view(1, 1, 3) + noise
                stripe = (label * size) // num_classes
                image[:, stripe:stripe + 3] = 255 - image[:, stripe:stripe + 3]
                pixels = image.clamp(0, 255).to(torch.uint8).numpy()
                Image.fromarray(pixels).save(os.path.join(class_dir, f'{i:04d}{extension}'))
    return root


@pytest.fixture
def image_folder(tmp_path):
    return write_image_folder(str(tmp_path / 'data'))


def tiny_dataset(num_classes=2, per_class=32):
    """In memory, the same images for train and test: class c's pixels are 200c + noise."""
    generator = torch.Generator().manual_seed(0)
    labels = torch.arange(num_classes).repeat_interleave(per_class)
    images = (labels.view(-1, 1, 1, 1) * 200 + torch.randint(0, 50, (len(labels), 32, 32, 3),
                                                           generator=generator)).to(torch.uint8)
    split = {'images': images, 'labels': labels}
    return {'train': split, 'test': split, 'classes': [str(c) for c in range(num_classes)],
            'mean': (0.5,) * 3, 'std': (0.25,) * 3}


def compile_with_backend(monkeypatch, backend):
    """torch.compile uses this backend (the scripts' mode dropped: it picks inductor's options)."""
    compile_function = torch.compile
    monkeypatch.setattr(torch, 'compile', lambda model, mode=None, **kwargs:
                        compile_function(model, backend=backend, **kwargs))


def warm_up_as_on_cuda(monkeypatch, script, graphs):
    """main() warms up fully, as on CUDA; the list returned gets len(graphs) when it ends."""
    warmed = []
    warm_up = script.warm_up

    def full_warm_up(*args, full):
        warm_up(*args, full=True)
        warmed.append(len(graphs))
    monkeypatch.setattr(script, 'warm_up', full_warm_up)
    return warmed


def script_command(name, *args, hyp=None):
    """A script's command line; with hyp ({'GROUP.NAME': value}), as after an edit of hyp."""
    path = os.path.join(REPO, f'{name}.py')
    if not hyp:
        return [sys.executable, path, *args]
    return [sys.executable, '-c', MAIN_WITH_HYP, path, json.dumps(hyp), *args]


def run_script(name, *args, hyp=None, timeout=600):
    return subprocess.run(script_command(name, *args, hyp=hyp), capture_output=True, text=True,
                          timeout=timeout)


def study_dir(log_dir):
    (directory,) = list(log_dir.iterdir())
    return directory


def summary_of(log_dir):
    return json.loads((study_dir(log_dir) / 'summary.json').read_text())


def free_port():
    with socket.socket() as probe:
        probe.bind(('127.0.0.1', 0))
        return probe.getsockname()[1]


def torchrun(*launcher_flags):
    return [sys.executable, '-m', 'torch.distributed.run', *launcher_flags]


def descendants(pid):
    children = {}
    for entry in filter(str.isdigit, os.listdir('/proc')):
        try:
            with open(f'/proc/{entry}/stat') as f:
                parent = int(f.read().rpartition(')')[2].split()[1])
        except (OSError, ValueError, IndexError):  # the process has ended meanwhile
            continue
        children.setdefault(parent, []).append(int(entry))
    found = []
    frontier = [pid]
    while frontier:
        offspring = children.get(frontier.pop(), [])
        found += offspring
        frontier += offspring
    return found


def torchrun_worker(launcher_pid, rank):
    """The pid of torchrun's (launcher_pid's) worker of this rank, or None."""
    for pid in descendants(launcher_pid):
        try:
            with open(f'/proc/{pid}/environ', 'rb') as f:
                environment = dict(item.partition(b'=')[::2] for item in f.read().split(b'\0'))
        except OSError:
            continue
        if environment.get(b'RANK') == str(rank).encode():
            return pid
    return None


def script_changes(name):
    """docs/layout.md's section '### NAME.py (from PARENT.py)', to the next heading."""
    import re
    with open(os.path.join(REPO, 'docs', 'layout.md')) as f:
        text = f.read()
    section = re.search(rf'^### {re.escape(name)}\.py \(from \w+\.py\)\n(.*?)(?=^#|\Z)', text,
                        re.MULTILINE | re.DOTALL)
    assert section, f'docs/layout.md has no section on what {name}.py changes'
    return section.group(1)
