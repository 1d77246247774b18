"""studylib: the engine and analyses behind study.py, one module per job, in five layers. A module
imports only from its own layer and the layers below it (tests/engine/test_study_engine.py checks it):

1. The statistics (studylib.stats), on plain arrays; nothing of studylib below them. inference: a
   mean and its interval, the test against a target with its one-sided bound, comparisons,
   equivalence within a margin, Holm's adjustment, time ratios, runs needed. fits: power-law fits
   of error against epochs, epochs to a target accuracy, effective speedups and their Monte Carlo
   intervals. variance: test-set and distribution-wise standard deviations between runs and the
   class-aggregated calibration error of the ensemble of runs, one run at a time (EnsembleTally).
2. The study directory. errors: the errors and their exit statuses. records: RunRecord and
   FailedTry, from the process that trains a run to its file, and CompileRecord. files: the
   directory's files (records, failed tries, outputs, compile records), which runs are finished,
   atomic writes (StudyDir: every path of the directory). config: what a study is, Config and
   Study, from the command line to study.json and back, and what a command asks for (Request).
3. The reports. tables: a study as a pandas table, its saved outputs read on lookup, its ensemble
   tallies. analysis: what a study compares and how (configurations, comparisons by design, epoch
   curves), each analysis alone. looks: the looks at a study's results, and whether its claims
   are confirmatory. markdown: report.md. plots: the plots. report: summary.json's numbers, and
   writing them all.
4. The engine. hyp: each configuration's hyp, every value checked by its script's own rules.
   scripts: finding and loading the scripts as they are, checked for their method (METHOD_API:
   all the engine uses of them). data: the datasets, their tensor cache and fingerprint, the
   warmup's dummy data. device: device and precision, the allocator setting, torch.compile's
   graphs and recompile limits, and where runs happen (hosts, device models, versions).
   distribute: the processes' shared key-value store, queue, leases and heartbeats. runs: each
   run's seeds, training one run, its RunRecord and outputs, the warmups. compiling: the
   configurations compiled once per machine before the runs, each in a process of its own.
   collect: rank 0 writing what the processes publish. plan: each process's setup, DIR's lock,
   study.json checked and extended, rank 0's checks and the runs to train. launch: the work loop
   of a launch.
5. The command line. cli: every flag of study.py (configurations, grids, the flags after `--`,
   `study.py report`'s) parsed once into a config.Request, and main: a launch or a report, what
   it says and its exit status.

The state that crosses modules is typed, made once and not changed after: the Request (config),
this process's place among the others (distribute.World), its setup (plan.Process) and the Plan
that rank 0 makes and every process follows (plan.Plan).
"""
LAYERS = [
    ['stats.inference', 'stats.fits', 'stats.variance'],
    ['errors', 'records', 'files', 'config'],
    ['tables', 'analysis', 'looks', 'markdown', 'plots', 'report'],
    ['hyp', 'scripts', 'data', 'device', 'distribute', 'runs', 'compiling', 'collect', 'plan',
     'launch'],
    ['cli'],
]
