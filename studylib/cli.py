"""study.py's command line, parsed here alone: the study's flags, configurations and grids, the
flags after --, `study.py report`'s; and main: a launch or a report, its output and exit status."""
import argparse
import contextlib
import itertools
import os
import re
import signal
import sys
import threading

from . import report
from .config import Config, Request, ScriptFlags
from .data import DATASETS
from .distribute import StoreLost, World
from .errors import ReportFailed, RunsFailed, StorageError, Stopped, StudyError
from .launch import run_study
from .plan import SharedError
from .scripts import available_scripts, script_label, script_path

NAME = r'[A-Za-z0-9][A-Za-z0-9_.+-]*'       # a configuration's name, safe as a directory name
GRID_VALUE = r'[A-Za-z0-9_.+-]+'            # a number or a word: legible in a generated name


RESOLVE_HELP = ('a difference in points of accuracy (0.1 for 94.0%% against 94.1%%), fixed before '
                'the runs are seen: the report gives, for every comparison, the runs per '
                'configuration that resolve it at 80%% power at the observed spread')
MARGIN_HELP = ('an equivalence margin in points of accuracy (0.1: within 0.1 points either way): '
               'every comparison gets the two one-sided tests (TOST) of "the same accuracy", its '
               '90%% interval and p-value; fix it before looking at the results')
TIME_MARGIN_HELP = ('an equivalence margin of time, a ratio above 1 (1.05: neither more than 5%% '
                    'slower nor 5%% faster, i.e. within [1/1.05, 1.05]): every comparison gets '
                    'the TOST of "as fast as" per device model, on log seconds')


class Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, not the usage text, and not on every process
        raise StudyError(message)


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Each flag's default, and the epilog as written: the flags after -- with their help."""


def study_parser(description):
    epilog = ('The flags after --, for every configuration (SCRIPT ... -- --help: these alone)\n' +
              flag_parser().format_help().partition('options:\n')[2] +
              '\nUnder torchrun: one process per GPU. python study.py report DIR rebuilds the '
              'summary, report and plots.')
    parser = Parser(description=description, formatter_class=HelpFormatter, epilog=epilog)
    add = parser.add_argument
    add('script', help=f'the default script of the configurations: one of '
        f'{", ".join(available_scripts())} (with or without .py), or the path of a .py file')
    add('--runs', type=int, required=True, help='runs of each configuration')
    add('--study-dir', required=True, help='where the study lives (on the machine of rank 0)')
    add('--config', nargs='+', action='append', default=[], metavar='NAME [SCRIPT] [KEY=VALUE]',
        help='a configuration (repeatable): a name, optionally its own script (a name or a '
        'path), and hyperparameter overrides, e.g. --config random aug.flip=random; the first '
        'is the baseline of the comparisons')
    add('--grid', action='append', default=[], metavar='KEY=V1,V2,...', help='expand every '
        'configuration over these values (repeatable: all combinations)')
    add('--seed', type=int, default=0, help='run i takes its varied seeds from seed + i')
    add('--vary', choices=['init', 'order', 'aug', 'all'], default='all',
        help='the sources of randomness that change from run to run; the others are held')
    add('--target', type=float, help='accuracy target: tested against each mean, and the '
        'target of epochs-to-target with an epoch grid')
    add('--resolve', type=float, metavar='DELTA', help=RESOLVE_HELP)
    add('--save-logits', action='store_true', help="keep each run's test logits (fp16), with "
        'and without TTA: they give the variance and calibration analyses')
    add('--train-subset', type=float, metavar='FRACTION', help='train each run on its own random '
        'fraction of the training set (the mask is saved with the run)')
    add('--val-split', type=int, default=0, metavar='N', help='hold N training images out (a fixed '
        'split) and evaluate on them; test accuracy is recorded too')
    add('--lost-after', type=float, default=300, metavar='SECONDS', help='give up a run whose '
        'process has sent no heartbeat for this long (a lost machine)')
    return parser


def parse_grid(text):
    """KEY=V1,V2,... as (KEY, [V1, V2, ...]), refusing values that would make illegible names."""
    key, sep, values = text.partition('=')
    values = values.split(',') if sep else []
    if not key or not all(values) or not values:
        raise StudyError(f'--grid {text}: give KEY=V1,V2,... (for example opt.train_epochs=5,10,20)')
    for value in values:
        if not re.fullmatch(GRID_VALUE, value):
            raise StudyError(f'--grid {key}: {value!r} is not a number or a word (letters, digits, '
                             '_.+-); set other values with --config')
    if len(set(values)) < len(values):
        raise StudyError(f'--grid {key}: a value is given twice')
    return key, values


def grid_names(keys):
    """A grid key's short name in configuration names: its last part, unless two keys share it."""
    leaves = [key.split('.')[-1] for key in keys]
    return [leaf if leaves.count(leaf) == 1 else key for key, leaf in zip(keys, leaves)]


def expand(configs, grids, implicit_baseline):
    """{name: Config}: every configuration at every combination of the grids' values, named
    NAME,KEY=VALUE,... (KEY=VALUE,... for the implicit baseline)."""
    keys = [key for key, _ in grids]
    expanded = {}
    for name, script, overrides in configs:
        for values in itertools.product(*(values for _, values in grids)):
            point = [f'{short}={value}' for short, value in zip(grid_names(keys), values)]
            full = ','.join(point if implicit_baseline and point else [name, *point])
            expanded[full] = Config(
                name=full, script=script, base=name, grid=dict(zip(keys, values)),
                overrides=[*overrides, *(f'{k}={v}' for k, v in zip(keys, values))])
    return expanded


def parse_configs(raw, default_script):
    """[(name, script label, overrides)] from the --config flags."""
    configs = []
    for name, *rest in raw:
        if not re.fullmatch(NAME, name):
            raise StudyError(f'--config {name}: a configuration starts with its NAME (letters, '
                             'digits, _.+-), then SCRIPT or KEY=VALUE ...: --config random '
                             'aug.flip=random')
        if name in [known for known, _, _ in configs]:
            raise StudyError(f'configuration names must differ; used more than once: {name}')
        script = script_label(script_path(rest.pop(0))) if rest and '=' not in rest[0] else \
            default_script
        configs.append((name, script, rest))
    return configs


def with_default_script(configs, default_script, typed):
    """The configurations, with the positional script's own first (the baseline) when every
    --config names another script, so that it is never dropped; and the line saying so, or None."""
    if not configs or any(script == default_script for _, script, _ in configs):
        return configs, None
    name = os.path.basename(default_script).removesuffix('.py')
    if not re.fullmatch(NAME, name) or name in [known for known, _, _ in configs]:
        raise StudyError(f'the script {typed} is in no --config (each names its own SCRIPT): give '
                         f'it one, --config NAME first (the baseline), or give one of the '
                         "configurations' scripts in its place")
    return [(name, default_script, []), *configs], (
        f'the script {typed} is in no --config: it is trained as the configuration {name}, the '
        'baseline of the comparisons')


def parse_known(parser, argv):
    """The parsed flags; a flag that is not study.py's is refused, saying where it belongs when it
    is one of those after --."""
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        flags = ' '.join(unknown)
        where = (f'flags of the scripts go after --: study.py SCRIPT --runs N --study-dir DIR -- '
                 f'{flags}' if are_flags(unknown) else
                 "study.py's flags are in python study.py --help; the scripts' go after --")
        raise StudyError(f'unrecognized arguments: {flags} ({where})')
    return args


def parse_args(argv):
    """The launch's Request: the configurations resolved ({name: Config}, grids expanded), the
    flags after -- (ScriptFlags) and what rank 0 says about the command before it starts."""
    argv = list(argv)
    split = argv.index('--') if '--' in argv else len(argv)
    script_flags = argv[split + 1:]
    argv = argv[:split]
    if {'-h', '--help'} & set(script_flags):
        flag_parser().print_help()
        raise SystemExit(0)
    parser = study_parser('Many trainings of the airbench scripts, on every GPU of one or many '
                          'machines, with the statistics that research studies need.')
    args = parse_known(parser, argv)
    if args.runs < 1:
        raise StudyError(f'--runs must be at least 1, not {args.runs}')
    if args.train_subset is not None and not 0 < args.train_subset <= 1:
        raise StudyError(f'--train-subset is a fraction in (0, 1], not {args.train_subset}')
    if args.val_split < 0:
        raise StudyError(f'--val-split is a number of images, not {args.val_split}')
    if not args.lost_after > 0:
        raise StudyError(f'--lost-after is a positive number of seconds, not {args.lost_after}')
    script = script_label(script_path(args.script))
    configs, note = with_default_script(parse_configs(args.config, script), script, args.script)
    grids = [parse_grid(text) for text in args.grid]
    repeated = sorted({key for key, _ in grids if [k for k, _ in grids].count(key) > 1})
    if repeated:
        raise StudyError(f'--grid {repeated[0]} is given twice; give all its values in one --grid')
    return Request(script=script, runs=args.runs, study_dir=args.study_dir,
                   configs=expand(configs or [('baseline', script, [])], grids,
                                  implicit_baseline=not args.config),
                   config=tuple(tuple(words) for words in args.config), grid=tuple(args.grid),
                   seed=args.seed, vary=args.vary, target=args.target, resolve=args.resolve,
                   save_logits=args.save_logits, train_subset=args.train_subset,
                   val_split=args.val_split, lost_after=args.lost_after,
                   flags=parse_flags(script_flags),
                   notes=(note,) if note else ())


def parse_report_args(argv):
    parser = Parser(prog='study.py report', description='Rebuild summary.json, report.md, '
                    'runs.csv and the plots of a study from its records, without training.')
    parser.add_argument('study_dir', metavar='DIR')
    parser.add_argument('--target', type=float, help="the accuracy target (default: the study's)")
    parser.add_argument('--resolve', type=float, metavar='DELTA', help=RESOLVE_HELP)
    parser.add_argument('--margin', type=float, metavar='POINTS', help=MARGIN_HELP)
    parser.add_argument('--time-margin', type=float, metavar='RATIO', help=TIME_MARGIN_HELP)
    parser.add_argument('--speedup', action='store_true', help='require the epochs-to-target and '
                        'effective-speedup analysis (an error if the study has no epoch grid)')
    parser.add_argument('--variance', action='store_true', help='require the variance and '
                        'calibration analysis (an error if the study saved no logits)')
    args = parser.parse_args(argv)
    if args.margin is not None and not args.margin > 0:
        raise StudyError(f'--margin is a positive number of points of accuracy (0.1), not '
                         f'{args.margin}')
    if args.time_margin is not None and not args.time_margin > 1:
        raise StudyError(f'--time-margin is a ratio above 1 (1.05 for within 5%), not '
                         f'{args.time_margin}')
    return args


FOR_STUDY_PY = {'runs': '--runs', 'seed': '--seed', 'log_dir': '--log-dir'}


class FlagParser(argparse.ArgumentParser):
    def error(self, message):
        raise StudyError(f'the flags after -- are not valid: {message}')


def flag_parser():
    parser = FlagParser(prog='study.py SCRIPT ... --', add_help=False,
                        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add = parser.add_argument
    add('--dataset', default='cifar10', choices=DATASETS,
        help='folder: any image-folder dataset; the others also from their torchvision layout')
    add('--data-dir', default='data/DATASET', help='an image folder (train/<class>/*, '
        "test/<class>/*) or torchvision's layout (downloaded when absent); cached as tensors")
    add('--train-splits', default='train', help='image-folder splits to train on, e.g. train,valid')
    add('--device', default='auto', help='auto (CUDA if present), cpu, cuda, cuda:1, ...')
    add('--precision', default='auto', choices=['auto', 'fp16', 'bf16', 'fp32'], help="auto: the "
        "scripts' own (fp16 on CUDA, bf16 autocast on a CPU with native bf16, else fp32)")
    add('--epochs', type=float, help='the same as --hyp opt.train_epochs=EPOCHS, applied first')
    add('--hyp', action='append', default=[], metavar='KEY=VALUE', help='a hyp entry of every '
        "configuration (repeatable), e.g. opt.lr=10, checked by the script's rules before any run")
    add('--epoch-eval', action=argparse.BooleanOptionalAction, default=True,
        help='the untimed evaluation after each epoch')
    add('--warmup', action=argparse.BooleanOptionalAction, default=True,
        help='an untimed warmup of each configuration on random data before the timed runs')
    add('--deterministic', action='store_true', help='CUDA: a seed repeats a run bitwise (slower)')
    for flag in FOR_STUDY_PY.values():
        add(flag, help=argparse.SUPPRESS)
    return parser


def parse_flags(flags):
    """The flags after -- as ScriptFlags, refused when they are study.py's own or not valid."""
    args = flag_parser().parse_args(flags)
    for key, flag in FOR_STUDY_PY.items():
        if getattr(args, key) is not None:
            raise StudyError(f'{flag} after -- is for the script alone; study.py has its own '
                             f'(--runs, --seed before --) and writes to --study-dir')
    if args.dataset == 'folder' and args.data_dir == 'data/DATASET':
        raise StudyError('--dataset folder needs --data-dir DIR (a directory with train/ and '
                         'test/)')
    data_dir = f'data/{args.dataset}' if args.data_dir == 'data/DATASET' else args.data_dir
    return ScriptFlags(dataset=args.dataset, data_dir=data_dir, train_splits=args.train_splits,
                       device=args.device, precision=args.precision, epochs=args.epochs,
                       hyp=tuple(args.hyp), epoch_eval=args.epoch_eval, warmup=args.warmup,
                       deterministic=args.deterministic)


def are_flags(flags):
    """Whether flags are all flags of the part after -- (study.py's own, as --seed, are not)."""
    with contextlib.suppress(StudyError):
        args = flag_parser().parse_args(flags)
        return all(getattr(args, key) is None for key in FOR_STUDY_PY)
    return False


def report_main(argv):
    """study.py report DIR: 0 with the report written (a warning line for each damaged file it
    does not count), 1 for a command or directory refused, 3 where no report could be written."""
    try:
        args = parse_report_args(argv)
        summary = report.write_outputs(args.study_dir, target=args.target, resolve=args.resolve,
                                require_speedup=args.speedup, require_variance=args.variance,
                                margin=args.margin, time_margin=args.time_margin)
    except StorageError as error:
        print(f'error: {error}', file=sys.stderr, flush=True)
        return ReportFailed.exit_status
    except StudyError as error:
        print(f'error: {error}', file=sys.stderr, flush=True)
        return StudyError.exit_status
    except Exception as error:  # noqa: BLE001: an analysis or a write that fails says so
        print(f'error: {report.report_failure(args.study_dir, error)}', file=sys.stderr, flush=True)
        return ReportFailed.exit_status
    for line in summary['damaged']:
        print(f'warning: damaged, not counted: {line}', file=sys.stderr, flush=True)
    print(f'rebuilt {args.study_dir}: summary.json, report.md, runs.csv and the plots')
    return 0


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
        request = parse_args(argv)
        world = World.of_environment()
        return run_study(request, world, ['study.py', *argv])
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
    except (KeyboardInterrupt, Stopped) as stop:  # before the launch was planned
        if world is not None and world.rank == 0:
            print('\nStopped before training; the same command starts or continues the study.',
                  file=sys.stderr, flush=True)
        return 130 if isinstance(stop, KeyboardInterrupt) else 143
    finally:
        if in_main_thread:
            signal.signal(signal.SIGTERM, previous_handler)
