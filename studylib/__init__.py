"""studylib: the engine and analyses behind study.py, one module per job.

The engine. cli: the command line (configurations, grids, `report`) into Configs. hyp: the flags
after `--` and each configuration's hyp, every value checked by the scripts' rules. config: what a
study is, Config and Study, from the command line to study.json and back. scripts: finding and
loading the scripts as they are, checked for their method (METHOD_API: all the engine uses of
them). data: the datasets, their tensor cache and fingerprint, the warmup's dummy data. device:
device and precision, the allocator setting, compiled-graph counts. files: the study directory's
files (records, failed tries, outputs), which runs are finished, atomic writes. plan: DIR's lock,
study.json checked and extended, the runs to train. setup: each process's setup and rank 0's
plan. distribute: the processes' shared key-value store, queue, leases and heartbeats. runs: each
run's seeds, training one run, its RunRecord and outputs. records: RunRecord and FailedTry, from
the process that trains a run to its file. collect: rank 0 writing what the processes publish.
launch: the work loop of a launch, its signals and exit statuses.

The analyses. inference: statistics on plain arrays (a mean and its interval, the test against a
target with its one-sided bound, comparisons, equivalence within a margin, Holm's adjustment, time
ratios, runs needed). fits: power-law fits of error
against epochs, epochs to a target accuracy, effective speedups and their Monte Carlo intervals.
variance: test-set and distribution-wise standard deviations between runs and the class-aggregated
calibration error of the ensemble of runs, one run at a time (EnsembleTally). analysis: what a
study compares and how (configurations, comparisons by design, epoch curves), each analysis alone.
load: a study as a pandas table, its saved outputs read on lookup, its ensemble tallies. summary:
summary.json's numbers. looks: the looks at a study's results, and whether its claims are
confirmatory. markdown: report.md. plots: the plots. report: writing them all, and `study.py
report`.
"""
