"""Each configuration's hyp: the script's, then --epochs N as opt.train_epochs=N, then each --hyp,
then the configuration's overrides, in that order (a later one wins), every value checked against
the script's own rules (its HYP_CHOICES and HYP_RANGES)."""
import ast
import copy
import math

from .errors import StudyError

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
    key = '.'.join(path)
    kind = type(default)
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


def set_entry(hyp, key, value):
    """Set hyp's entry KEY (GROUP.NAME, at any depth), refusing one hyp lacks with the keys there
    are. The one setter of hyp entries: study.py's --hyp and overrides, the tools and the tests."""
    *groups, name = key.split('.')
    node = hyp
    path = []
    for part in groups:
        if not isinstance(node.get(part), dict):
            break
        node = node[part]
        path.append(part)
    if len(path) != len(groups) or not groups or name not in node:
        where = '.'.join(path) or 'hyp'
        raise StudyError(f'no hyperparameter {key} ({where} has {", ".join(node)})')
    node[name] = value


def with_entries(hyp, entries):
    """A copy of hyp with entries ({'GROUP.NAME': value}) set, in order."""
    hyp = copy.deepcopy(hyp)
    for key, value in entries.items():
        set_entry(hyp, key, value)
    return hyp


def set_value(hyp, text):
    """Set KEY=VALUE in hyp (VALUE a Python literal, or a word such as 'random' as a string)."""
    key, sep, value = text.partition('=')
    if not sep:
        raise StudyError(f'{text!r} is not KEY=VALUE (for example opt.lr=10)')
    try:
        parsed = ast.literal_eval(value)
    except (ValueError, SyntaxError):
        parsed = value
    set_entry(hyp, key, parsed)


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
