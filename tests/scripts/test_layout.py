"""The method-first layout: each script is its method, then one banner, then the code that runs
it, identical in all scripts, so that a reader can copy the method, or a block of it, as it is."""
import ast
import glob
import os
import shutil
import subprocess
import sys

import pytest

from conftest import ALL_SCRIPTS, CPU, REPO, TINY_WIDTHS, load_script, tiny_dataset
from studylib.hyp import with_entries

import shared_blocks as shared  # tools/, on the path from conftest


def test_below_the_banner_identical_and_method_blocks_shared():
    for name in shared.METHOD_DIFFERENCES:
        assert shared.differences(name) == []
    tails = {shared.split(shared.read(name))[2] for name in ALL_SCRIPTS}
    assert len(tails) == 1


def test_airbench94_within_the_line_limits():
    counts = shared.layout('airbench94')
    assert all(counts[part] <= limit for part, limit in shared.LIMITS.items()), counts


def test_one_name_per_assignment_in_every_python_file():
    paths = [os.path.join(REPO, path) for path in ('*.py', 'studylib/**/*.py', 'tools/*.py',
                                                    'tests/**/*.py', 'studies/*.py')]
    files = sorted({file for path in paths for file in glob.glob(path, recursive=True)})
    assert len(files) > 50
    packed = {file: shared.packed_assignments(file) for file in files}
    assert {path: lines for path, lines in packed.items() if lines} == {}


def test_the_packing_check_finds_each_kind(tmp_path, monkeypatch):
    monkeypatch.setattr(shared, 'REPO', str(tmp_path))
    (tmp_path / 'packed.py').write_text(
        'a, b = 1, 2\nc = d = 3\nif (e := 4):\n    pass\nn, c, h, w = x.shape\nf = (1, 2)\n')
    assert shared.packed_assignments('packed') == [1, 2, 3]


def test_the_check_detects_drift_and_sync_repairs_it(tmp_path, monkeypatch):
    for name in ('airbench94', 'airbench95'):
        shutil.copy(os.path.join(REPO, f'{name}.py'), tmp_path)
    monkeypatch.setattr(shared, 'REPO', str(tmp_path))
    path = tmp_path / 'airbench95.py'
    text = path.read_text()
    path.write_text(text.replace('return 0.95**5 *', 'return 0.9**5 *')
                    .replace("'--runs', type=int, default=25", "'--runs', type=int, default=5"))
    assert shared.differences('airbench95') == [
        'airbench95: the part below the banner differs from airbench94.py',
        "airbench95: block 'lookahead_decay' differs from airbench94.py"]
    shared.sync('airbench95')
    assert shared.differences('airbench95') == []
    assert path.read_text() == text  # its own header and hyp kept


def top_level_names(source):
    names = set()
    for node in ast.parse(source).body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names |= {t.id for target in node.targets for t in ast.walk(target)
                      if isinstance(t, ast.Name)}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(alias.asname or alias.name).split('.')[0] for alias in node.names}
    return names


@pytest.mark.parametrize('name', ALL_SCRIPTS)
def test_the_method_uses_nothing_from_below_the_banner(name):
    _, method, tail = shared.split(shared.read(name))
    used = {node.id for node in ast.walk(ast.parse(method)) if isinstance(node, ast.Name)}
    only_below = top_level_names(tail) - top_level_names(method)
    assert only_below and not used & only_below, used & only_below


def test_the_method_part_alone_trains_a_network(ab94):
    """The module docstring and method part, what a reader copies, executed without the rest."""
    doc, method, _ = shared.split(shared.read('airbench94'))
    namespace = {}
    exec(compile(''.join(doc) + method, 'method_part', 'exec'), namespace)
    assert 'main' not in namespace and 'load_dataset' not in namespace
    hyp = with_entries(namespace['hyp'], {'opt.batch_size': 32, 'opt.train_epochs': 2,
                                          'net.widths': TINY_WIDTHS, 'net.tta_level': 1})
    result = namespace['train'](tiny_dataset(), hyp, CPU, 'fp32', seed=1, epoch_eval=False)
    whole = ab94.train(tiny_dataset(), hyp, CPU, 'fp32', seed=1, epoch_eval=False)
    assert result['epoch_train_losses'] == whole['epoch_train_losses']
    assert result['tta_val_acc'] == whole['tta_val_acc']
    assert result['epoch_train_losses'][-1] < result['epoch_train_losses'][0]


@pytest.mark.slow
@pytest.mark.parametrize('name', ALL_SCRIPTS)
def test_import_does_nothing_but_define(name):
    code = (f'import sys, importlib.util; sys.argv = ["x", "--runs", "0"]\n'
            f'spec = importlib.util.spec_from_file_location("m", '
            f'{os.path.join(REPO, name + ".py")!r})\n'
            'm = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)\n'
            'assert callable(m.main) and callable(m.train)')
    result = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True,
                            cwd=REPO, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout == '' and result.stderr == ''


def test_the_tail_needs_only_torch_and_torchvision():
    """Nothing of studylib's below the banner: what only studies need lives there."""
    _, _, tail = shared.split(shared.read('airbench94'))
    modules = set()
    for node in ast.walk(ast.parse(tail)):
        if isinstance(node, ast.Import):
            modules |= {alias.name.split('.')[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            modules.add(node.module.split('.')[0])
    assert modules - set(sys.stdlib_module_names) == {'torchvision', 'PIL'}, modules


@pytest.mark.parametrize('name', ALL_SCRIPTS)
def test_each_script_owns_the_rules_of_its_own_hyp(name):
    """HYP_CHOICES and HYP_RANGES stand above the banner and name the script's own entries only;
    the tail checks a str or bool entry of hyp only against HYP_CHOICES, so each is there."""
    script = load_script(name)
    _, method, _ = shared.split(shared.read(name))
    assert {'HYP_CHOICES', 'HYP_RANGES'} <= top_level_names(method)
    entries = {f'{group}.{key}' for group, values in script.hyp.items() for key in values}
    assert set(script.HYP_CHOICES) | set(script.HYP_RANGES) <= entries
    assert not set(script.HYP_CHOICES) & set(script.HYP_RANGES)
    for group, values in script.hyp.items():
        for key, value in values.items():
            if isinstance(value, (str, bool)):
                assert value in script.HYP_CHOICES[f'{group}.{key}']
