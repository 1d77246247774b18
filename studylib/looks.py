"""The looks at a study's results, and whether its claims are confirmatory or exploratory.

A test's error rate holds when what it tests was fixed before the data were seen and it is made
once, at the number of runs planned (a fixed-n design). A target chosen or changed after runs were
finished, runs added beyond the plan after a report (the study extended because of what it
showed), or a claim made before the planned runs are all in (an interim look) each lets the data
choose the test, so the p-values no longer give the error rate: such claims are exploratory.
Confirmatory takes a design fixed in advance: a fixed n run to its end, or a sequential design
whose looks spend alpha by a bound set beforehand (O'Brien and Fleming 1979; Lan and DeMets 1983),
which study.py does not implement.

Every report appends a look to DIR/analysis/looks.json (when, the target tested, the runs planned
and finished, the configurations); study.json's launches (each with its start and request) and the
records' finish times tell the rest, for reports written before looks.json existed.
"""
import argparse
import datetime
import json
import os

from .errors import StudyError
from .files import StudyDir, atomic_write, read_json

RULE = ('A claim is confirmatory when its target, the configurations and the runs per '
        'configuration were fixed before any result was seen and it is made once, when the '
        'planned runs are in (a fixed-n design); a study extended or retargeted after a look is '
        'confirmatory only under a sequential design whose looks spend alpha by a bound fixed in '
        "advance (O'Brien-Fleming, Lan-DeMets), which study.py does not implement.")


def read_looks(study_dir):
    """The looks recorded in DIR/analysis/looks.json, oldest first ([] before the first)."""
    path = StudyDir(study_dir).looks()
    if not os.path.exists(path):
        return []
    try:
        return read_json(path, 'remove it (the looks it recorded are then forgotten)')['looks']
    except (StudyError, KeyError, TypeError):
        return []  # an unreadable history is started again; the launches still tell the rest


def record_look(study_dir, summary, target_given):
    looks = read_looks(study_dir) + [dict(
        written=now(), target=summary['target'], target_given=target_given,
        runs_requested=summary['runs_requested'], runs_finished=summary['runs_finished'],
        configs=list(summary['configs']))]
    path = StudyDir(study_dir).looks()
    os.makedirs(os.path.dirname(path), exist_ok=True)
    atomic_write(path, json.dumps(dict(looks=looks), indent=2))


def now():
    return datetime.datetime.now(datetime.timezone.utc).isoformat()


def launch_request(launch):
    """(runs, configurations, grids, target) a launch asked for, as it recorded them or, before
    launches kept their request, as its command gave them; None where neither can be read."""
    request = launch.get('request') or request_of_command(launch.get('command') or [])
    if request is None:
        return None
    return (request['runs'], frozenset(tuple(config) for config in request['configs']),
            frozenset(request['grids']), request['target'])


def request_of_command(command):
    """The --runs, --config, --grid and --target of a command recorded before launches kept their
    request (a reader of those frozen records); None without --runs."""
    words = list(command)[1:]
    words = words[:words.index('--')] if '--' in words else words
    parser = argparse.ArgumentParser(add_help=False, exit_on_error=False)
    parser.add_argument('--runs', type=int)
    parser.add_argument('--config', nargs='+', action='append', default=[])
    parser.add_argument('--grid', action='append', default=[])
    parser.add_argument('--target', type=float)
    try:
        args, _ = parser.parse_known_args(words)
    except (argparse.ArgumentError, SystemExit):
        return None
    if args.runs is None:
        return None
    return dict(runs=args.runs, configs=args.config, grids=args.grid, target=args.target)


def finished_before(runs, moment):
    """How many runs finished before `moment` (ISO times, as records and launches write them)."""
    if not len(runs) or 'finished' not in runs:
        return 0
    return int((runs['finished'].astype(str) < moment).sum())


def launch_reasons(launches, runs):
    """Why the launches make the claims exploratory: a launch that, with runs already finished,
    changed the target, or extended the plan (more runs, new configurations or grid values)
    after the report the launch before it wrote at its end."""
    reasons = []
    previous = None
    for launch in launches:
        request = launch_request(launch)
        if request is None:
            continue
        seen = finished_before(runs, launch['started'])
        if previous is not None and seen:
            runs_then, configs_then, grids_then, target_then = previous
            runs_now, configs_now, grids_now, target_now = request
            if target_now is not None and target_now != target_then:
                reasons.append(f"the target was set to {target_now} by the launch of "
                               f"{launch['started']}, after {seen} runs were finished "
                               f"(before: {target_then})")
            if runs_now > runs_then or not (configs_now <= configs_then and
                                            grids_now <= grids_then):
                reasons.append(f"the launch of {launch['started']} extended the study (--runs "
                               f'{runs_then} -> {runs_now}, or new configurations or grid '
                               f'values) after {seen} runs had been reported')
        previous = request if previous is None or request[3] is not None else \
            request[:3] + previous[3:]
    return reasons


def history_reasons(history, summary):
    """Why the recorded looks make the claims exploratory (an extension after a look), and the
    notes they leave (runs added within the plan after a look: an interim look, harmless to a
    fixed n claimed at its end)."""
    reasons = []
    notes = []
    for look in history:
        if not look.get('runs_finished'):
            continue
        grown = summary['runs_requested'] > look['runs_requested'] or \
            not set(summary['configs']) <= set(look['configs'])
        if grown:
            reasons.append(f"runs were added beyond the plan after the report of {look['written']}"
                           f" ({look['runs_finished']} runs finished then, "
                           f"{look['runs_requested']} per configuration planned; now "
                           f"{summary['runs_requested']})")
        elif summary['runs_finished'] > look['runs_finished']:
            notes.append(f"a report was written at {look['written']} with {look['runs_finished']} "
                         'runs finished; the runs added since were planned before it')
    return list(dict.fromkeys(reasons)), list(dict.fromkeys(notes))


def looks_analysis(study, runs, summary, target_given, history):
    """Whether this report's claims are confirmatory: exploratory with its reasons (a target given
    to this report, or a target or plan changed by a launch, after runs were finished; runs added
    beyond the plan after a report; a partial study), the notes of harmless looks, and the rule."""
    reasons = []
    if target_given is not None and target_given != study.target and summary['runs_finished']:
        reasons.append(f'the target {target_given} was given to `study.py report` after '
                       f"{summary['runs_finished']} runs were finished (the study's own: "
                       f'{study.target})')
    reasons += launch_reasons(study.launches, runs)
    extended, notes = history_reasons(history, summary)
    reasons += extended
    if summary['status'] == 'partial' and summary['runs_finished']:
        reasons.append(f"{summary['runs_finished']} of "
                       f"{len(summary['configs']) * summary['runs_requested']} runs are in: a "
                       'claim before the planned runs is an interim look')
    reasons = list(dict.fromkeys(reasons))
    return dict(exploratory=bool(reasons), reasons=reasons, notes=notes, rule=RULE,
                earlier_looks=len(history))
