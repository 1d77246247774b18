"""The scripts a study trains: found by name beside study.py or by path anywhere, loaded (a copy
that defines only its method takes the rest from the repository's shared part), checked for what
study.py uses, and their hyp for each configuration."""
import argparse
import ast
import builtins
import contextlib
import functools
import hashlib
import importlib.util
import io
import os
import re
from dataclasses import dataclass

from .errors import StudyError

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED_FROM = 'airbench94.py'  # every script's part below the banner is this one's, byte for byte
BANNER_PHRASE = 'identical in all the airbench scripts'
# What study.py calls of a script's method, and of the shared part below its banner
METHOD_API = ('hyp', 'train', 'build_net', 'infer', 'CifarLoader', 'source_seeds')
SHARED_API = ('parse_args', 'study_hyp', 'load_dataset', 'dummy_dataset',
              'resolve_device_precision', 'DataError', 'keep_freed_memory_in_process',
              'compiled_graph_count')
PROVIDED = ('torch', 'time')  # modules the shared part uses that a method-only copy is given


@dataclass
class Script:
    """A script of the study, loaded in this process: its label (how study.json names it), file,
    code's SHA-256, module, and its arguments from the flags after --."""
    label: str
    path: str
    sha256: str
    module: object
    args: argparse.Namespace


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


def top_level_names(source):
    """The names a module's top level defines (functions, classes, assignments, imports)."""
    names = set()
    for node in ast.parse(source).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {n.id for target in targets for n in ast.walk(target)
                      if isinstance(n, ast.Name)}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(alias.asname or alias.name).split('.')[0] for alias in node.names}
    return names


@functools.cache
def shared_part():
    """(first line, source) of the part below the banner, from the banner's comment block on."""
    with open(os.path.join(REPO, SHARED_FROM)) as f:
        lines = f.read().splitlines(keepends=True)
    start = next(i for i, line in enumerate(lines) if BANNER_PHRASE in line)
    while start > 0 and lines[start - 1].startswith('#'):
        start -= 1
    return start + 1, ''.join(lines[start:])


def bound_names(tree):
    """Every name a module binds anywhere: definitions, assignments, arguments, imports, the
    names of caught exceptions."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(alias.asname or alias.name).split('.')[0] for alias in node.names}
        elif isinstance(node, ast.ExceptHandler) and node.name:
            names.add(node.name)
    return names


@functools.cache
def method_minimum():
    """What a copy must define itself: what study.py calls of the method, and what the shared
    part takes from it (the names it uses and binds nowhere, but the modules it is given)."""
    tree = ast.parse(shared_part()[1])
    used = {node.id for node in ast.walk(tree)
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load)}
    taken = used - bound_names(tree) - set(dir(builtins)) - set(PROVIDED) - {'__file__'}
    return (*METHOD_API, *sorted(taken - set(METHOD_API)))


def load_script(path):
    """Import the script at path as a module. A copy that lacks any of the shared part's
    functions gets the repository's shared part first, then runs its own code (whatever it
    defines itself wins). Refuses a file without the method, naming what it lacks."""
    with open(path) as f:
        source = f.read()
    spec = importlib.util.spec_from_file_location(
        f'airbench_study_{os.path.basename(path)[:-3]}', path)
    script = importlib.util.module_from_spec(spec)
    try:
        if not set(SHARED_API) <= top_level_names(source):
            first_line, shared = shared_part()
            exec(f'import {", ".join(PROVIDED)}', script.__dict__)
            exec(compile('\n' * (first_line - 1) + shared, os.path.join(REPO, SHARED_FROM),
                         'exec'), script.__dict__)
        spec.loader.exec_module(script)
    except Exception as error:
        raise StudyError(f'{path} could not be imported ({type(error).__name__}: {error})') \
            from None
    missing = [name for name in method_minimum() if not hasattr(script, name)]
    missing += [] if script.__doc__ else ['a module docstring (the first line of its --help)']
    if missing:
        raise StudyError(f'{path} lacks {", ".join(missing)}, which study.py needs: a copy '
                         f'defines its method ({", ".join(method_minimum())}: a script\'s part '
                         'above the banner) and may leave the rest to the repository\'s')
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
    try:
        script.study_hyp(script_args)
    except ValueError as error:
        raise StudyError(f'the flags after --: {error}') from None
    return script_args


def are_script_flags(flags):
    """Whether flags are all flags of the scripts (what belongs after --)."""
    module = load_script(os.path.join(REPO, SHARED_FROM))
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            module.parse_args(flags)
    except SystemExit:
        return False
    return True


def open_script(label, flags):
    """The script as a study names it, loaded, with its arguments from the flags after --."""
    path = label_path(label)
    module = load_script(path)
    return Script(label=label, path=path, sha256=sha256_of(path), module=module,
                  args=parse_script_flags(module, flags))


def check_key(hyp, key):
    """Refuse a KEY of KEY=VALUE that is not in hyp, naming the keys there are."""
    node, path = hyp, []
    for part in key.split('.'):
        if not isinstance(node, dict) or part not in node:
            where = '.'.join(path) or 'hyp'
            there = ', '.join(node) if isinstance(node, dict) else 'no keys'
            raise StudyError(f'no hyperparameter {key} ({where} has {there})')
        node, path = node[part], [*path, part]


def config_hyp(script, script_args, overrides):
    """The script's hyp with its flags (--epochs, --hyp ...) and then the overrides, whose values
    the script's own --hyp parser checks."""
    for override in overrides:
        key, sep, _ = override.partition('=')
        if not sep:
            raise StudyError(f'{override!r} is not KEY=VALUE (for example opt.lr=10)')
        check_key(script.hyp, key)
        if key == 'opt.train_epochs' and script_args.epochs is not None:
            raise StudyError(f'{override} and --epochs {script_args.epochs:g} after -- both set the '
                             'epochs; drop --epochs')
    flags = argparse.Namespace(**{**vars(script_args), 'hyp': script_args.hyp + list(overrides)})
    try:
        return script.study_hyp(flags)
    except ValueError as error:
        raise StudyError(str(error)) from None
