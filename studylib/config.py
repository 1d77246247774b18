"""What a study is: its configurations (Config) and study.json as a whole (Study), one type each
from the command line to study.json and back; and what a command asks for (Request, with the flags
after its --, ScriptFlags), made once by the command line and read by the launch."""
import dataclasses
import json
import os
from dataclasses import dataclass, field

from .errors import StudyError
from .files import StudyDir, atomic_write, load_json, read_json


def as_json(value):
    """value as JSON gives it back (tuples as lists, keys as strings): what study.json compares."""
    return json.loads(json.dumps(value))


@dataclass
class Config:
    """A configuration: a script's hyp with overrides, at one point of the grids. The command line
    makes it (script: a repository script's name or a file's absolute path), the launch resolves
    its script_sha256 and hyp, and study.json stores it under its name as to_json()."""
    name: str
    script: str
    overrides: list = field(default_factory=list)
    base: str = ''
    grid: dict = field(default_factory=dict)
    script_sha256: str | None = None
    hyp: dict | None = None

    JSON_KEYS = ('script', 'script_sha256', 'overrides', 'base', 'grid', 'hyp')

    def resolved(self, script_sha256, hyp):
        return dataclasses.replace(self, script_sha256=script_sha256, hyp=hyp)

    def to_json(self):
        return as_json({key: getattr(self, key) for key in self.JSON_KEYS})

    @classmethod
    def from_json(cls, name, entry, where):
        missing = [key for key in cls.JSON_KEYS if not isinstance(entry, dict) or key not in entry]
        if missing:
            raise StudyError(f'{where}: configuration {name} lacks {", ".join(missing)}; restore '
                             'study.json from a copy, or use another --study-dir')
        return cls(name=name, **{key: entry[key] for key in cls.JSON_KEYS})


@dataclass
class Study:
    """study.json: the settings (seed, --vary, subset, validation split, --save-logits, precision,
    the data), the configurations in order (the first is the baseline), the runs of each, the
    target, the commands that made the study and every launch (id, start, command, environment)."""
    settings: dict
    configs: dict
    runs: int
    commands: list = field(default_factory=list)
    launches: list = field(default_factory=list)
    target: float | None = None
    # Not stored: why study.json could not be read, where the study was read from its copy
    damaged: str | None = field(default=None, compare=False)

    def to_json(self):
        content = dict(settings=as_json(self.settings),
                       configs={name: config.to_json() for name, config in self.configs.items()},
                       runs=self.runs, commands=self.commands, launches=self.launches)
        return content if self.target is None else {**content, 'target': self.target}

    @classmethod
    def from_json(cls, content, where):
        if not isinstance(content, dict) or not isinstance(content.get('configs'), dict) or \
                'settings' not in content or 'runs' not in content:
            raise StudyError(f'{where} was not written by this study.py (no settings, configs and '
                             'runs); continue it with the study.py that made it, or use another '
                             '--study-dir')
        configs = {name: Config.from_json(name, entry, where)
                   for name, entry in content['configs'].items()}
        return cls(settings=content['settings'], configs=configs, runs=content['runs'],
                   commands=content.get('commands', []), launches=content.get('launches', []),
                   target=content.get('target'))

    @classmethod
    def read(cls, study_dir):
        """The study in study_dir, or None where there is none yet. A study.json that cannot be
        read is read from its copy, and `damaged` says why; with no intact copy, StudyError."""
        path = StudyDir(study_dir).study_json()
        copy = StudyDir(study_dir).study_copy()
        if not os.path.exists(path) and not os.path.exists(copy):
            return None
        try:
            content = load_json(path)
        except ValueError as problem:  # cut short, or absent: its copy is whole
            error = f'{path} is unreadable ({problem})'
            if not os.path.exists(copy):
                raise StudyError(f'{error}, and it has no copy ({copy}) to read instead. Its '
                                 f'records are kept in {study_dir}/runs: restore study.json from a '
                                 'copy of your own, or use another --study-dir') from None
            study = cls.from_json(read_json(copy, 'study.json is unreadable too: restore one of '
                                                  'them from a copy of your own, or use another '
                                                  '--study-dir'), copy)
            return dataclasses.replace(study, damaged=error)
        return cls.from_json(content, path)  # another shape: its copy has it too

    def write(self, study_dir):
        content = json.dumps(self.to_json(), indent=2)
        atomic_write(StudyDir(study_dir).study_json(), content)
        atomic_write(StudyDir(study_dir).study_copy(), content)


@dataclass(frozen=True)
class ScriptFlags:
    """The flags after study.py's --, the same for every configuration (docs/studies.md)."""
    dataset: str
    data_dir: str
    train_splits: str
    device: str
    precision: str
    epochs: float | None
    hyp: tuple
    epoch_eval: bool
    warmup: bool
    deterministic: bool


@dataclass(frozen=True)
class Request:
    """What a launch's command asks for, parsed once (studylib.cli). configs: {name: Config} from
    --config and --grid, their hyp not yet resolved; config and grid: those flags as typed, which
    the launch records; notes: what rank 0 says of the command before it starts."""
    script: str
    runs: int
    study_dir: str
    configs: dict
    config: tuple
    grid: tuple
    seed: int
    vary: str
    target: float | None
    resolve: float | None
    save_logits: bool
    train_subset: float | None
    val_split: int
    lost_after: float
    flags: ScriptFlags
    notes: tuple
