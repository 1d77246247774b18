"""studylib: the engine and analyses behind study.py, one module per job.

cli: the command line (configurations, grids, `report`). scripts: finding, checking and loading
the scripts and their hyp. plan: what a study is (study.json), its directory and lock, the runs to
train. distribute: the processes' shared key-value store, queue, heartbeats and rank 0's
collector. runs: training one run, its record and outputs. launch: one launch from setup to
report. stats: accuracies, tests, comparisons, times per device, and the analyses below over a
study's runs. fits: power-law fits of error against epochs, epochs to a target accuracy, effective
speedups and their bootstrap intervals. variance: test-set and distribution-wise standard
deviations between runs, and the class-aggregated calibration error of an ensemble of runs.
report: summary.json, report.md, runs.csv and plots. load: a study as a pandas table and arrays.
"""
