"""The quick tier stays quick: a test that starts processes (a script run as a user runs it,
study.py under torchrun, inductor's compiler) is marked slow. conftest.py's audit hook sees every
process a test starts, however it starts it, and fails a quick test that starts one
(quick_tests_start_no_process); this checks that the hook names what it sees."""
import conftest
from conftest import record_process_start, unexpected_processes


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
