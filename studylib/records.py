"""A run's record, one type from the process that trains the run to its file in the study directory:
RunRecord for a finished run (RUN.json), FailedTry for a try that raised or whose process was lost
(RUN.failed.json). They travel through the store as Message. CompileRecord: what compiling a
configuration cost a process of a launch (DIR/compiles/LAUNCH.json)."""
import dataclasses
import json
import math
import types
from dataclasses import dataclass


@dataclass
class RunRecord:
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
    forward_variants_not_warmed_up: list | None = None  # a config's first run: [] if all warmed
    started: str | None = None           # when its process began it: the gap since its previous
    #                                      record is the engine's time between runs
    earlier_failures: int | None = None  # tries of earlier launches that failed

    failed = False

    def to_json(self):
        return {key: value for key, value in dataclasses.asdict(self).items()
                if value is not None or key == 'val_acc'}

    @classmethod
    def from_json(cls, content):
        """The record a RUN.json holds, checked field by field against this class: ValueError
        naming what is missing, unknown or of the wrong kind (a damaged record, or one of another
        version of study.py). Accuracies lie in [0, 1]; no number is NaN or infinite."""
        if not isinstance(content, dict):
            raise ValueError(f'it holds {type(content).__name__}, not a record')
        fields = {field.name: field for field in dataclasses.fields(cls)}
        required = [name for name, field in fields.items()
                    if field.default is dataclasses.MISSING]
        missing = [name for name in required if name not in content]
        unknown = sorted(set(content) - set(fields))
        if missing or unknown:
            raise ValueError('; '.join(
                ([f'lacks {", ".join(missing)}'] if missing else []) +
                ([f'has fields this study.py does not know ({", ".join(unknown)})']
                 if unknown else [])))
        for name, value in content.items():
            if not is_of_type(value, fields[name].type):
                raise ValueError(f'{name} is {value!r}, not {type_name(fields[name].type)}')
        for name in ('accuracy', 'test_acc', 'val_acc'):
            if content.get(name) is not None and not 0 <= content[name] <= 1:
                raise ValueError(f'{name} is {content[name]!r}, not an accuracy in [0, 1]')
        return cls(**content)


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

    @classmethod
    def from_json(cls, content):
        return cls(**{field.name: content[field.name] for field in dataclasses.fields(cls)})

    def to_json(self):
        return dict(config=self.config, run=self.run, failed=True,
                    **{key: value for key, value in dataclasses.asdict(self).items()
                       if key not in ('config', 'run')})


@dataclass
class CompileRecord:
    """What compiling a configuration cost one process of a launch, at one stage: 'warmup' (each
    training process's untimed warmup; a study made at 576cd79 or before may also hold 'before
    the runs', from the compiling processes study.py then had). graphs: graphs dynamo traced;
    compiled, from_cache: inductor's graphs compiled anew and loaded from its FX graph cache (both
    0 where inductor did not compile); error: why the stage failed, or None."""
    config: str
    launch: str
    stage: str
    rank: int
    host: str
    device: str
    device_model: str
    seconds: float
    graphs: int
    compiled: int
    from_cache: int
    error: str | None = None

    def to_json(self):
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, content):
        return cls(**{field.name: content.get(field.name) for field in dataclasses.fields(cls)})

    def came_from(self):
        """In a word: 'cache' (every inductor graph loaded), 'compiled' (at least one compiled
        anew), 'eager' (nothing compiled: no graph, or no inductor graph) or 'failed'."""
        if self.error is not None:
            return 'failed'
        if self.compiled:
            return 'compiled'
        return 'cache' if self.from_cache else 'eager'


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


def is_of_type(value, annotation):
    """Whether a JSON value is of a record field's type: int, float (an int too; finite), str,
    bool, dict, list, or a union of them with None. bool is not a number here."""
    if isinstance(annotation, types.UnionType):
        return any(is_of_type(value, option) for option in annotation.__args__)
    if annotation is type(None):
        return value is None
    if annotation in (int, float) and isinstance(value, bool):
        return False
    if annotation is float:
        return isinstance(value, (int, float)) and math.isfinite(value)
    return isinstance(value, annotation)


def type_name(annotation):
    if isinstance(annotation, types.UnionType):
        return ' or '.join(type_name(option) for option in annotation.__args__)
    return {type(None): 'null', float: 'a finite number', int: 'a whole number'}.get(
        annotation, annotation.__name__)
