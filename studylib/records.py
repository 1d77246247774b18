"""A run's record, one type from the process that trains the run to its file in the study directory:
RunRecord for a finished run (RUN.json), FailedTry for a try that raised or whose process was lost
(RUN.failed.json). They travel through the store as Message."""
import dataclasses
import json
from dataclasses import dataclass


@dataclass
class RunRecord:
    """A finished run: what it is (configuration, run, script, seeds), what it gave (accuracies,
    timed seconds, steps, losses) and where it ran."""
    config: str
    run: int
    script: str
    seed: int
    seeds: dict
    vary: str
    accuracy: float              # what the statistics are of: TTA accuracy on accuracy_on
    accuracy_on: str             # 'test', or 'validation' with --val-split
    test_acc: float
    val_acc: float | None        # the final network's without TTA, when evaluated per epoch
    total_time_seconds: float
    steps: int
    graphs_compiled_during_run: int
    epoch_train_losses: list     # None for a loss that was not finite
    diverged: bool
    train_images: int
    rank: int
    host: str
    device: str
    device_model: str
    torch: str
    launch: str
    finished: str
    subset_seed: int | None = None       # with --train-subset
    earlier_failures: int | None = None  # tries of earlier launches that failed

    failed = False

    def to_json(self):
        return {key: value for key, value in dataclasses.asdict(self).items()
                if value is not None or key == 'val_acc'}


@dataclass
class FailedTry:
    """A try of a run that raised (or whose process was lost again and again)."""
    config: str
    run: int
    error_type: str
    error: str
    rank: int
    host: str
    device: str
    device_model: str
    launch: str
    finished: str

    failed = True

    def to_json(self):
        return dict(config=self.config, run=self.run, failed=True,
                    **{key: value for key, value in dataclasses.asdict(self).items()
                       if key not in ('config', 'run')})


@dataclass
class Message:
    """What a process publishes for rank 0 when a run ends: its record or failed try, and whether
    its outputs travel beside it."""
    record: RunRecord | FailedTry
    has_outputs: bool

    def encode(self):
        return json.dumps(dict(record=self.record.to_json(), has_outputs=self.has_outputs))

    @classmethod
    def decode(cls, text):
        content = json.loads(text)
        record = dict(content['record'])
        kind = FailedTry if record.pop('failed', False) else RunRecord
        return cls(record=kind(**record), has_outputs=content['has_outputs'])
