"""What the paper's experiments share: a command line, running their study with study.py (on one
device, or under torchrun on every GPU), and writing the paper-shaped table from its records.

Each experiment file gives its configurations (as study.py's --config and --grid flags) and a
function that turns the study's runs (study.load_study's table) into the table of the paper."""
import argparse
import json
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
import study  # noqa: E402


def parse(description, default_runs, argv, add_options=None):
    """The experiment's flags, and the flags after -- for the scripts (data, device, ...)."""
    argv = list(argv)
    split = argv.index('--') if '--' in argv else len(argv)
    parser = argparse.ArgumentParser(description=description,
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument('--study-dir', required=True, help='where the study lives')
    parser.add_argument('--runs', type=int, default=default_runs, help="runs per configuration "
                        "(default: the paper's n)")
    parser.add_argument('--table-only', action='store_true', help='no training: the table from '
                        'the runs recorded so far')
    if add_options is not None:
        add_options(parser)
    args = parser.parse_args(argv[:split])
    args.script_flags = argv[split + 1:]
    return args


def run(args, study_flags):
    """Train the study's missing runs (the same command continues it), then, on rank 0, return
    its runs as a table and its summary (summary.json's numbers; with --table-only rebuilt from
    the records); None on the other processes, and on failure (study.py said why)."""
    if not args.table_only:
        status = study.main(['--runs', str(args.runs), '--study-dir', args.study_dir,
                             *study_flags, '--', *args.script_flags])
        if status != 0:
            sys.exit(status)
    if os.environ.get('RANK', '0') != '0':
        return None
    runs, _ = study.load_study(args.study_dir, outputs=False)
    if not len(runs):
        sys.exit(f'error: {args.study_dir} holds no finished runs yet')
    summary_path = os.path.join(args.study_dir, 'summary.json')
    if args.table_only or not os.path.exists(summary_path):
        return runs, study.write_outputs(args.study_dir)
    with open(summary_path) as f:
        return runs, json.load(f)


def write_table(args, title, lines):
    """Print the table and keep it beside the study as paper_table.md."""
    text = '\n'.join([f'# {title}', '', *lines]) + '\n'
    with open(os.path.join(args.study_dir, 'paper_table.md'), 'w') as f:
        f.write(text)
    print(text)


def mean_and_interval(values, digits=2):
    """'93.40% ± 0.05 (n 10)': the mean in percent with the half-width of its 95% CI."""
    entry = study.describe(list(values))
    if entry['ci_low'] is None:
        return f"{100 * entry['mean']:.{digits}f}% (n {entry['n']})"
    half = 100 * (entry['ci_high'] - entry['ci_low']) / 2
    return f"{100 * entry['mean']:.{digits}f}% ± {half:.{digits}f} (n {entry['n']})"


def shown(result, digits=1, scale=1.0, unit=''):
    """An interval result of study's (epochs to a target, a speedup) as 'estimate [low, high]',
    'open' for an open bound, and the reason appended where the interval's coverage was not
    measured in its conditions ('no fit (reason)' where there is no estimate)."""
    if result is None or 'estimate' not in result:
        return 'no fit' + (f" ({result['reason']})" if result and result.get('reason') else '')
    if result['estimate'] is None:
        return f"no fit ({result['reason']})"
    values = [None if v is None else f'{scale * v:.{digits}f}{unit}'
              for v in (result['estimate'], result['ci_low'], result['ci_high'])]
    text = f"{values[0]} [{values[1] or 'open'}, {values[2] or 'open'}]"
    return text if result['reliable'] else f"{text} (unreliable: {result['reason']})"
