"""The scripts a study trains: found by name beside study.py or by path anywhere, and loaded as
they are, checked for the method that study.py calls (a copy that holds only the method will do)."""
import functools
import hashlib
import importlib.util
import inspect
import os
import re
from collections.abc import Callable
from dataclasses import dataclass

from .errors import StudyError

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@dataclass(frozen=True)
class Part:
    """A name of a script's method that the engine uses: what the engine expects of it and, for a
    function or class, the parameters it passes (by these names, in this order; the callable may
    take more after them, with defaults)."""
    expected: str
    parameters: tuple = ()


# Everything the engine uses of a script: its method's part above the banner, nothing below it
METHOD_API = {
    'hyp': Part("the hyperparameters, {group: {entry: value}}: every configuration's defaults"),
    'HYP_CHOICES': Part("each switch's choices, by 'group.entry': every value is checked"),
    'HYP_RANGES': Part("each number's inclusive range, by 'group.entry'"),
    'train': Part('one run on the device; returns tta_val_acc, val_acc, total_time_seconds, steps, '
                  'epoch_train_losses and the trained net',
                  ('data', 'hyp', 'device', 'precision', 'seed', 'net', 'epoch_eval')),
    'build_net': Part("the network from hyp['net'] (configurations that agree on the entries it "
                      'reads share one network, reinitialized by each run)',
                      ('arch', 'num_classes', 'device', 'precision')),
    'infer': Part("fp32 logits of normalized images, as train() evaluates; batch_size's default "
                  "sizes the warmup's test batches, and a parameter named as an entry of "
                  "hyp['net'] is given that entry", ('net', 'images', 'tta_level', 'autocast')),
    'CifarLoader': Part('the loader: its normalize(images) and .images give the test images as '
                        'train() normalizes them, for saved logits',
                        ('images', 'labels', 'batch_size', 'mean', 'std', 'aug', 'dtype')),
    'source_seeds': Part("a run's seed to its sources' seeds, {'init': .., 'order': .., 'aug': ..}",
                         ('seed',)),
}


@dataclass(frozen=True)
class Method:
    """What the engine may use of a loaded script: METHOD_API's names (its fields), nothing else of
    the module, so that the engine cannot come to depend on another by accident."""
    hyp: dict
    HYP_CHOICES: dict
    HYP_RANGES: dict
    train: Callable
    build_net: Callable
    infer: Callable
    CifarLoader: type
    source_seeds: Callable


@dataclass(frozen=True)
class Script:
    """A script of the study, loaded in this process; label: how study.json names it."""
    label: str
    path: str
    sha256: str
    method: Method


def available_scripts():
    return sorted(name.removesuffix('.py') for name in os.listdir(REPO)
                  if re.fullmatch(r'airbench.*\.py', name))


def script_path(script):
    """The file of SCRIPT: a script of the repository by name (with or without .py), or a path to
    any .py file. A bare NAME.py that is both a file in the current directory and another file
    of the repository is refused: which one is meant cannot be told."""
    name = script.removesuffix('.py')
    ours = os.path.join(REPO, f'{name}.py')
    if os.sep not in script and name in available_scripts():
        if script.endswith('.py') and os.path.isfile(script) and not os.path.samefile(script, ours):
            raise StudyError(f'{script} is both a file here ({os.path.abspath(script)}) and a '
                             f'script of the repository ({ours}): give ./{script} for the file '
                             f'here, or {name} for the repository\'s')
        return ours
    if not script.endswith('.py'):
        raise StudyError(f'unknown script {name!r}; the scripts in {REPO} are '
                         f'{", ".join(available_scripts())} (or give the path of a .py file)')
    if not os.path.isfile(script):
        raise StudyError(f'{script}: no such file; give the name of a script of the repository '
                         f'({", ".join(available_scripts())}) or the path of a .py file with the '
                         'same interface')
    return os.path.abspath(script)


def script_label(path):
    """How a study names a script: its name for the repository's scripts, else its path."""
    return os.path.basename(path)[:-3] if os.path.dirname(path) == REPO else path


def label_path(label):
    """The file of a script as a study names it (script_label's inverse)."""
    return label if os.path.isabs(label) else os.path.join(REPO, f'{label}.py')


def sha256_of(path):
    with open(path, 'rb') as f:
        return hashlib.sha256(f.read()).hexdigest()


def load_script(script):
    """Import a script as a module, as it is, a new module each call (script_path: a script of the
    repository by name, or a path), named as its file. Refuses a file that cannot be imported or
    lacks any of METHOD_API, naming what it lacks. The one loader of scripts: tools and tests use
    it too."""
    path = script_path(script)
    spec = importlib.util.spec_from_file_location(os.path.basename(path)[:-3], path)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as error:
        raise StudyError(f'{path} could not be imported ({type(error).__name__}: {error})') \
            from None
    missing = [name for name in METHOD_API if not hasattr(module, name)]
    if missing:
        raise StudyError(f'{path} lacks {", ".join(missing)}, which study.py needs: a copy '
                         f'defines the method ({", ".join(METHOD_API)}: a script\'s part above '
                         'the banner), and needs nothing below it')
    for name, part in METHOD_API.items():
        taken = leading_parameters(getattr(module, name), part.parameters)
        if taken != part.parameters:
            raise StudyError(f'{path}: its {name} takes ({", ".join(taken)}) first, where study.py '
                             f'passes ({", ".join(part.parameters)}): {part.expected}')
    return module


def leading_parameters(member, expected):
    """The names of member's first parameters, as many as expected has (a class: its
    constructor's); a *args among them stands for the expected names from there on (a wrapper's
    (data, hyp, *args, **kwargs) passes them on)."""
    if not expected:
        return ()
    try:
        parameters = list(inspect.signature(member).parameters.values())
    except (TypeError, ValueError):  # not callable
        return ()
    names = []
    for parameter in parameters[:len(expected)]:
        if parameter.kind is inspect.Parameter.VAR_POSITIONAL:
            return (*names, *expected[len(names):])
        names.append(parameter.name)
    return tuple(names)


@functools.cache
def repository_tail():
    """The repository's airbench94.py, loaded once as a library for what its tail owns (reading
    images, the image-folder test, CIFAR-10 and its mean and std, a training set's own, the device,
    its precision, the warmup). The tail, identical in every script, is never taken from a study's
    own script: the engine meets those only by their method (METHOD_API)."""
    return load_script(os.path.join(REPO, 'airbench94.py'))


def method_of(module):
    """The Method of a loaded script (load_script checked that it has METHOD_API)."""
    return Method(**{name: getattr(module, name) for name in METHOD_API})


def open_script(label):
    path = label_path(label)
    return Script(label=label, path=path, sha256=sha256_of(path),
                  method=method_of(load_script(path)))
