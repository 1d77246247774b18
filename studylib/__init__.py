"""studylib: the engine and analyses behind study.py, one module per job, in five layers. A module
imports only from its own layer and those below it (tests/engine/test_study_engine.py checks it):

1. The statistics (studylib.stats), on plain arrays; nothing of studylib below them. inference:
   means, target tests, comparisons, equivalence, Holm's adjustment, time ratios, runs needed.
   fits: power laws of error against epochs, epochs to a target, effective speedups, intervals.
   variance: test-set and distribution-wise standard deviations between runs, the ensemble's
   calibration error, one run at a time (EnsembleTally).
2. The study directory. errors: the errors and their exit statuses. records: RunRecord, FailedTry
   and CompileRecord. files: the directory's files, which runs are finished, atomic writes
   (StudyDir: every path). config: Config and Study, from the command line to study.json and
   back, and what a command asks for (Request).
3. The reports. tables: a study as a pandas table, its outputs read on lookup, its ensemble
   tallies. analysis: what a study compares and how, each analysis alone. looks: whether its
   claims are confirmatory. markdown: report.md. plots: the plots. report: summary.json, and
   writing them all.
4. The engine. hyp: each configuration's hyp, checked by its script's rules. scripts: loading the
   scripts as they are, checked for their method (METHOD_API: all the engine uses of them). data:
   the datasets, their tensor cache and fingerprint. device: device and precision, torch.compile's
   graphs and recompile limits, where runs happen. distribute: the processes' shared store,
   queue, leases and heartbeats. runs: training one run, its record and outputs, the warmups.
   collect: rank 0 writing what the processes publish. plan: each process's setup, DIR's lock,
   study.json, the runs to train. launch: the work loop of a launch.
5. The command line. cli: every flag of study.py parsed once into a config.Request, and main: a
   launch or a report, what it says and its exit status.

The state that crosses modules is typed, made once and not changed after: the Request (config),
this process's place among the others (distribute.World), its setup (plan.Process) and the Plan
that rank 0 makes and every process follows (plan.Plan).
"""
LAYERS = [
    ['stats.inference', 'stats.fits', 'stats.variance'],
    ['errors', 'records', 'files', 'config'],
    ['tables', 'analysis', 'looks', 'markdown', 'plots', 'report'],
    ['hyp', 'scripts', 'data', 'device', 'distribute', 'runs', 'collect', 'plan',
     'launch'],
    ['cli'],
]
