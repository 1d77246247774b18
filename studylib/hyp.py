"""The flags after -- (the data, the device and the hyp of every configuration) and each
configuration's hyp: the script's, then --epochs N as opt.train_epochs=N, then each --hyp, then
the configuration's overrides, in that order (a later one wins), every value checked."""
import argparse
import ast
import contextlib
import copy
import math

from .data import DATASETS
from .errors import StudyError

FOR_STUDY_PY = {'runs': '--runs', 'seed': '--seed', 'log_dir': '--log-dir'}


class FlagParser(argparse.ArgumentParser):
    def error(self, message):
        raise StudyError(f'the flags after -- are not valid: {message}')


def flag_parser():
    parser = FlagParser(prog='study.py ... --', add_help=False)
    add = parser.add_argument
    add('--dataset', default='cifar10', choices=DATASETS,
        help='folder: any image-folder dataset; the others also from their torchvision layout')
    add('--data-dir', default='data/DATASET', help='an image folder (train/<class>/*, '
        "test/<class>/*) or torchvision's layout (downloaded when absent); cached as tensors")
    add('--train-splits', default='train', help='image-folder splits to train on, e.g. train,valid')
    add('--device', default='auto', help='auto (CUDA if present), cpu, cuda, cuda:1, ...')
    add('--precision', default='auto', choices=['auto', 'fp16', 'bf16', 'fp32'])
    add('--epochs', type=float, help='the same as --hyp opt.train_epochs=EPOCHS, applied first')
    add('--hyp', action='append', default=[], metavar='KEY=VALUE')
    add('--epoch-eval', action=argparse.BooleanOptionalAction, default=True, help='untimed')
    add('--warmup', action=argparse.BooleanOptionalAction, default=True, help='untimed, dummy data')
    add('--deterministic', action='store_true', help='CUDA: a seed repeats a run bitwise (slower)')
    for flag in FOR_STUDY_PY.values():
        add(flag, help=argparse.SUPPRESS)
    return parser


def parse_flags(flags):
    """The flags after --, refused when they are study.py's own or not valid."""
    args = flag_parser().parse_args(flags)
    for key, flag in FOR_STUDY_PY.items():
        if getattr(args, key) is not None:
            raise StudyError(f'{flag} after -- is for the script alone; study.py has its own '
                             f'(--runs, --seed before --) and writes to --study-dir')
    if args.dataset == 'folder' and args.data_dir == 'data/DATASET':
        raise StudyError('--dataset folder needs --data-dir DIR (a directory with train/ and '
                         'test/)')
    if args.data_dir == 'data/DATASET':
        args.data_dir = f'data/{args.dataset}'
    return args


def are_flags(flags):
    """Whether flags are all flags of the part after -- (study.py's own, as --seed, are not)."""
    with contextlib.suppress(StudyError):
        args = flag_parser().parse_args(flags)
        return all(getattr(args, key) is None for key in FOR_STUDY_PY)
    return False


def check_number(key, rule, value, default, ranges):
    """A number where hyp has one: whole where hyp's is (but epochs), finite, in its range."""
    whole = type(default) is int and not rule.endswith('epochs')
    low, high = ranges.get(rule, (0, math.inf) if default >= 0 else (-math.inf, 0))
    if type(value) not in ((int,) if whole else (int, float)) or not (
            math.isfinite(value) and low <= value <= high):
        raise StudyError(f'--hyp {key} takes {"a whole number" if whole else "a number"} from '
                         f'{low} to {high}, not {value!r}')


def check_hyp_values(value, default, choices, ranges, path=()):
    """Refuse, before any training, a value unlike hyp's own (its type, a dict's keys, a tuple's
    length) or outside the script's own HYP_CHOICES and HYP_RANGES (by GROUP.NAME: widths.block1
    takes the rule of widths: choices and ranges); path: the keys from hyp down to value."""
    key, kind = '.'.join(path), type(default)
    rule = '.'.join(path[:2])
    if kind in (dict, tuple) and (type(value) is not kind or len(value) != len(default) or
                                  kind is dict and value.keys() != default.keys()):
        raise StudyError(f'--hyp {key} takes a value like {default!r}, not {value!r}')
    if kind in (dict, tuple):
        for part in default if kind is dict else range(len(default)):
            check_hyp_values(value[part], default[part], choices, ranges,
                             (*path, part) if kind is dict else path)
    elif rule in choices and value not in choices[rule]:
        raise StudyError(f'--hyp {key} takes one of {choices[rule]}, not {value!r}')
    elif kind in (int, float):
        check_number(key, rule, value, default, ranges)


def set_value(hyp, text):
    """Set KEY=VALUE in hyp (KEY: GROUP.NAME, at any depth; VALUE a Python literal, or a word
    such as 'random' as a string), refusing a key hyp does not have, naming the keys there are."""
    key, sep, value = text.partition('=')
    if not sep:
        raise StudyError(f'{text!r} is not KEY=VALUE (for example opt.lr=10)')
    *groups, name = key.split('.')
    node, path = hyp, []
    for part in groups:
        if not isinstance(node.get(part), dict):
            break
        node, path = node[part], [*path, part]
    if len(path) != len(groups) or not groups or name not in node:
        where = '.'.join(path) or 'hyp'
        raise StudyError(f'no hyperparameter {key} ({where} has {", ".join(node)})')
    try:
        node[name] = ast.literal_eval(value)
    except (ValueError, SyntaxError):
        node[name] = value


def config_hyp(script_hyp, choices, ranges, flags, overrides=()):
    """A configuration's hyp: the script's (with the paper's no flipping on SVHN), --epochs, each
    --hyp and each override applied in that order, then every value checked against the script's
    rules (its HYP_CHOICES and HYP_RANGES)."""
    hyp = copy.deepcopy(script_hyp)
    if flags.dataset == 'svhn' and 'flip' in hyp.get('aug', {}):
        hyp['aug']['flip'] = 'none'  # digits are not mirror-symmetric (the paper's SVHN runs)
    epochs = [f'opt.train_epochs={flags.epochs}'] if flags.epochs is not None else []
    for text in [*epochs, *flags.hyp, *overrides]:
        set_value(hyp, text)
    check_hyp_values(hyp, script_hyp, choices, ranges)
    return hyp
