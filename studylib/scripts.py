"""The scripts a study trains: found by name beside study.py or by path anywhere, checked for the
interface study.py uses, and their hyp for each configuration."""
import argparse
import contextlib
import hashlib
import importlib.util
import io
import os
import re

from .errors import StudyError

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# What study.py uses of a script: its method and the shared part below its banner
SCRIPT_API = ('hyp', 'train', 'build_net', 'infer', 'CifarLoader', 'source_seeds', 'parse_args',
              'study_hyp', 'load_dataset', 'dummy_dataset', 'resolve_device_precision',
              'DataError', 'keep_freed_memory_in_process', 'compiled_graph_count')


def available_scripts():
    return sorted(name.removesuffix('.py') for name in os.listdir(REPO)
                  if re.fullmatch(r'airbench.*\.py', name))


def script_path(script):
    """The file of SCRIPT: a script of the repository by name (with or without .py), or a path to
    any .py file."""
    if script.endswith('.py') and (os.sep in script or not os.path.exists(
            os.path.join(REPO, script))):
        path = os.path.abspath(script)
        if not os.path.isfile(path):
            raise StudyError(f'{script}: no such file; give the name of a script of the '
                             f'repository ({", ".join(available_scripts())}) or the path of a .py '
                             'file with the same interface')
        return path
    name = os.path.basename(script).removesuffix('.py')
    if name not in available_scripts():
        raise StudyError(f'unknown script {name!r}; the scripts in {REPO} are '
                         f'{", ".join(available_scripts())} (or give the path of a .py file)')
    return os.path.join(REPO, f'{name}.py')


def script_label(path):
    """How a study names a script: its name for the repository's scripts, else its path."""
    return os.path.basename(path)[:-3] if os.path.dirname(path) == REPO else path


def sha256_of(path):
    with open(path, 'rb') as f:
        return hashlib.sha256(f.read()).hexdigest()


def load_script(path):
    """Import the script at path as a module, refusing a file without the interface."""
    name = os.path.basename(path)[:-3]
    spec = importlib.util.spec_from_file_location(f'airbench_study_{name}', path)
    script = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(script)
    except Exception as error:
        raise StudyError(f'{path} could not be imported ({type(error).__name__}: {error})') \
            from None
    missing = [attribute for attribute in SCRIPT_API if not hasattr(script, attribute)]
    if missing:
        raise StudyError(f'{path} lacks {", ".join(missing)}, which study.py needs: give it the '
                         'interface of the airbench scripts (copy one and edit its method)')
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
