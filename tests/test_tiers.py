"""The quick tier stays quick: a test that starts processes (a script run as a user
runs it, study.py under torchrun) or trains on the real data is marked slow, judged from what it
calls, directly or through the helpers and fixtures of tests/ (read from their source). What the
source does not show (a process started by a library, as inductor's compiler, or through an alias)
conftest.py's audit hook sees as it runs: quick_tests_start_no_process."""
import ast
import glob
import os
import textwrap

import conftest
from conftest import REPO, record_process_start, unexpected_processes

TESTS = os.path.join(REPO, 'tests')
# What starts a process: the standard library's calls (a helper that calls one starts one too)
PROCESS_CALLS = {('subprocess', name) for name in ('run', 'Popen', 'call', 'check_call',
                                                   'check_output')} | \
    {('os', name) for name in ('fork', 'system', 'spawnv', 'execv')} | \
    {('multiprocessing', 'Process')}
REAL_DATA_NAMES = {'REAL_DATA', 'AIRBENCH_REAL_DATA'}


def called(node):
    """(module, name) or (None, name) of every call in node (but of the functions it defines
    itself, whose own calls are among its calls); and every name it reads."""
    calls = set()
    names = set()
    local = {child.name for child in ast.walk(node)
             if isinstance(child, ast.FunctionDef) and child is not node}
    for child in ast.walk(node):
        if isinstance(child, ast.Call):
            function = child.func
            if isinstance(function, ast.Name) and function.id not in local:
                calls.add((None, function.id))
            elif isinstance(function, ast.Attribute) and isinstance(function.value, ast.Name):
                calls.add((function.value.id, function.attr))
        elif isinstance(child, ast.Name):
            names.add(child.id)
        elif isinstance(child, ast.Constant) and child.value in REAL_DATA_NAMES:
            names.add(child.value)
    return calls, names


def is_slow_mark(node):
    """pytest.mark.slow, as a decorator or in a module's pytestmark."""
    return isinstance(node, ast.Attribute) and node.attr == 'slow' and \
        isinstance(node.value, ast.Attribute) and node.value.attr == 'mark'


def functions(sources):
    """{name: FunctionDef} of every top-level function of the sources, and the modules (by name)
    whose pytestmark is slow."""
    found = {}
    slow_modules = set()
    for module, source in sources.items():
        for node in ast.parse(source).body:
            if isinstance(node, ast.FunctionDef):
                found[f'{module}:{node.name}'] = node
            elif isinstance(node, ast.Assign) and any(
                    isinstance(t, ast.Name) and t.id == 'pytestmark' for t in node.targets):
                if any(is_slow_mark(child) for child in ast.walk(node.value)):
                    slow_modules.add(module)
    return found, slow_modules


def heavy_functions(found):
    """The names of the functions (helpers, fixtures, tests) that start a process or read the real
    data, directly or through another of them (a fixed point over names: a helper is known by its
    name wherever it is imported)."""
    heavy = set()
    uses = {}
    for key, node in found.items():
        calls, names = called(node)
        uses[key] = ({name for _, name in calls}, names, {arg.arg for arg in node.args.args})
        if calls & PROCESS_CALLS or names & REAL_DATA_NAMES:
            heavy.add(node.name)
    while True:
        grown = {found[key].name for key, (calls, _, arguments) in uses.items()
                 if (calls | arguments) & heavy} - heavy
        if not grown:
            return heavy
        heavy |= grown


def unmarked_heavy_tests(sources):
    """module:test of every test that starts a process or reads the real data without the slow
    mark (on itself or its module)."""
    found, slow_modules = functions(sources)
    heavy = heavy_functions(found)
    return sorted(key for key, node in found.items()
                  if node.name.startswith('test_') and node.name in heavy and
                  key.partition(':')[0] not in slow_modules and
                  not any(is_slow_mark(d) or is_slow_mark(getattr(d, 'func', None))
                          for d in node.decorator_list))


def suite_sources():
    """{module name: source} of every test file and helper of tests/, in its folders too."""
    paths = sorted(glob.glob(os.path.join(TESTS, '**', '*.py'), recursive=True))
    return {os.path.basename(path)[:-3]: open(path).read() for path in paths}


def test_every_test_that_starts_processes_or_reads_the_real_data_is_marked_slow():
    assert unmarked_heavy_tests(suite_sources()) == []


def test_the_guard_finds_a_heavy_test_left_unmarked():
    """Through a helper of another module and a fixture, as the suite's own tests do."""
    helpers = textwrap.dedent('''
        import subprocess
        def run_it(*args):
            return subprocess.run(args)
        def launch_twice(*args):
            return [run_it(*args), run_it(*args)]
    ''')
    tests = textwrap.dedent('''
        import pytest
        from helpers import launch_twice
        @pytest.fixture
        def launched():
            return launch_twice('x')
        def test_direct():
            launch_twice('x')
        def test_through_a_fixture(launched):
            pass
        def test_real_data():
            return os.environ.get('AIRBENCH_REAL_DATA')
        @pytest.mark.slow
        def test_marked():
            launch_twice('x')
        def test_in_process():
            def launch_twice(*args):
                return args
            return launch_twice(1, 2)
    ''')
    assert unmarked_heavy_tests({'helpers': helpers, 'test_x': tests}) == [
        'test_x:test_direct', 'test_x:test_real_data', 'test_x:test_through_a_fixture']
    marked = 'import pytest\npytestmark = [pytest.mark.slow]\n' + tests
    assert unmarked_heavy_tests({'helpers': helpers, 'test_x': marked}) == []


def test_the_audit_hook_names_each_process_a_test_starts():
    """Python's audit events, as they are raised: a compiler started by inductor (a list of
    words), a shell command (one string), a fork (no program); the harmless ones are let pass."""
    events = [('subprocess.Popen', ('/usr/bin/g++', ['/usr/bin/g++', '-v'], None, None)),
              ('subprocess.Popen', ('uname', ['uname', '-p'], None, None)),
              ('subprocess.Popen', ('/venv/bin/python', ['/venv/bin/python', '/venv/lib/python3.11/'
                                    'site-packages/torch/_inductor/compile_worker/__main__.py',
                                    '--workers=2'], None, None)),
              ('os.system', ('make all',)), ('os.fork', ()), ('open', ('x', 'r', 0))]
    before = len(conftest.STARTED_PROCESSES)
    for event, args in events:
        record_process_start(event, args)
    started = conftest.STARTED_PROCESSES[before:]
    del conftest.STARTED_PROCESSES[before:]  # not this test's own processes: none were started
    assert started == [('subprocess.Popen', 'g++'), ('subprocess.Popen', 'uname'),
                       ('subprocess.Popen', 'inductor compile worker'), ('os.system', 'make'),
                       ('os.fork', '')]
    assert unexpected_processes(started) == [('subprocess.Popen', 'g++'), ('os.system', 'make'),
                                             ('os.fork', '')]
