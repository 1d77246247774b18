"""Training the runs of a study on this process's device: the data of each run (subset, validation
split), the warmup of every network before the first timed run, and each run's record and
outputs."""
import contextlib
import copy
import datetime
import hashlib
import inspect
import io
import json
import math
import socket
import time

import torch

from .device import compile_counts, device_model
from .errors import RunsFailed
from .records import CompileRecord, RunRecord
from .scripts import repository_tail


SOURCES = ('init', 'order', 'aug')  # the sources of randomness of the scripts' source_seeds


def run_seeds(source_seeds, seed, run, vary):
    """Run `run`'s seeds of the three sources: run i's for the varied ones, run 0's otherwise."""
    varied = source_seeds(seed + run)
    held = source_seeds(seed)
    return {source: (varied if vary in (source, 'all') else held)[source] for source in SOURCES}


def derived_seed(*parts):
    """A seed for something other than the three sources (a subset, the validation split)."""
    return int.from_bytes(hashlib.sha256(repr(parts).encode()).digest()[:7], 'little')


def validation_indices(num_train, val_split, seed):
    """The held-out training images of --val-split: a fixed random set, ascending."""
    generator = torch.Generator().manual_seed(derived_seed('validation', seed))
    return torch.randperm(num_train, generator=generator)[:val_split].sort().values


def training_mask(num_train, held_out, fraction, seed):
    """The training images of a run: all but the held-out ones, or a random fraction of those."""
    mask = torch.ones(num_train, dtype=torch.bool)
    mask[held_out] = False
    if fraction is not None:
        candidates = mask.nonzero().flatten()
        generator = torch.Generator().manual_seed(seed)
        chosen = candidates[torch.randperm(len(candidates), generator=generator)]
        mask[chosen[round(fraction * len(candidates)):]] = False
    return mask


class EntriesRead(dict):
    """A configuration's hyp['net'] as build_net sees it, noting each entry read: what makes the
    network (the other entries, TTA's or the whitening's init, change only how it is used)."""

    def __init__(self, entries):
        super().__init__(entries)
        self.read = set()

    def __getitem__(self, key):
        self.read.add(key)
        return super().__getitem__(key)

    def get(self, key, default=None):
        self.read.add(key)
        return super().get(key, default)

    def __contains__(self, key):
        self.read.add(key)
        return super().__contains__(key)

    def __iter__(self):  # every entry counts as read
        self.read.update(super().keys())
        return super().__iter__()

    def keys(self):
        return list(self)

    def items(self):
        return [(key, self[key]) for key in self]

    def values(self):
        return [self[key] for key in self]


class ForwardVariants:
    """The forward passes of the study's networks, as the variants a compiled network compiles a
    graph for, recorded by a forward pre-hook in the warmups and each configuration's first run;
    later runs meet the same passes and run without the hook, as their script alone runs."""

    def __init__(self):
        self.warmed_up = set()
        self.checked = set()  # the configurations whose first run was recorded

    @contextlib.contextmanager
    def recording(self, net, label):
        """Yields the set that receives the variants met inside the block."""
        seen = set()
        if not isinstance(net, torch.nn.Module):  # a copy's network may be anything
            yield seen
            return
        parameters = list(net.parameters())

        def record(module, inputs):
            images = inputs[0]
            seen.add((label, module.training, torch.is_grad_enabled(), tuple(images.shape),
                      str(images.dtype).removeprefix('torch.'),
                      images.is_contiguous(memory_format=torch.channels_last),
                      sum(p.requires_grad for p in parameters), len(parameters)))
        hook = net.register_forward_pre_hook(record)
        try:
            yield seen
        finally:
            hook.remove()

    def not_warmed_up(self, variants):
        """Descriptions of the variants that no warmup met: on CUDA, each compiles a graph (and
        captures a CUDA graph) inside a timed run."""
        return sorted(f"{label}: {'train' if training else 'eval'}, {'grad' if grad else 'no grad'}"
                      f", {'x'.join(map(str, shape))} {dtype} "
                      f"{'channels_last' if channels_last else 'contiguous'}, {trainable} of "
                      f'{parameters} parameters trainable'
                      for label, training, grad, shape, dtype, channels_last, trainable, parameters
                      in variants - self.warmed_up)


def evaluation_settings(infer, arch):
    """The entries of hyp['net'] besides tta_level that infer takes by name (airbench94_hiverge's
    tta_fraction): the evaluation as the method's train() runs it."""
    parameters = inspect.signature(infer).parameters
    return {name: arch[name] for name in parameters if name in arch and name != 'tta_level'}


def normalized_images(script, images, hyp, mean, std, precision):
    """Test images (uint8, N x 32 x 32 x 3, on the device) normalized as in the script's train()."""
    dtype = torch.float16 if precision == 'fp16' else torch.float32
    loader = script.CifarLoader(images, None, len(images), mean, std, hyp['aug'], dtype)
    return loader.normalize(loader.images)


def evaluation_logits(script, hyp, net, images, tta_level, device, precision):
    """A trained network's fp32 logits for normalized images, by infer as train() calls it."""
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=(precision == 'bf16'))
    settings = evaluation_settings(script.infer, hyp['net'])
    return script.infer(net, images, tta_level, autocast, **settings)


def random_split(n, num_classes, device):
    """n random images (uint8, N x 32 x 32 x 3) and labels: a warmup's, whose shapes alone make its
    graphs and kernels. The one maker of random CIFAR-shaped data (the tools call it too)."""
    return {'images': torch.randint(0, 256, (n, 32, 32, 3), dtype=torch.uint8, device=device),
            'labels': torch.randint(0, num_classes, (n,), device=device)}


def warmup_inputs(method, hyp, num_classes, num_eval, num_test, mean, std, precision, device):
    """The warmup's inputs, random with a run's shapes: two training batches (the tail's warm_up);
    an evaluated split of the batch sizes num_eval images take in infer (a full batch of its default
    batch_size and the rest, or all at once where a copy's infer has none); num_test test images
    normalized by the script's loader (None where num_test is 0)."""
    batch_size_parameter = inspect.signature(method.infer).parameters.get('batch_size')
    eval_batch = getattr(batch_size_parameter, 'default', None)
    if not isinstance(eval_batch, int) or eval_batch < 1:
        eval_batch = max(num_eval, 1)
    full_batch = eval_batch if num_eval >= eval_batch else 0
    data = {'train': random_split(2 * hyp['opt']['batch_size'], num_classes, device),
            'test': random_split(full_batch + num_eval % eval_batch, num_classes, device),
            'classes': list(range(num_classes)), 'mean': mean, 'std': std}
    if not num_test:
        return data, None
    images = random_split(num_test, num_classes, device)['images']
    return data, normalized_images(method, images, hyp, mean, std, precision)


def warm_up_network(method, hyp, net, device, precision, inputs, save_plain):
    """The tail's full warmup of train() on inputs from warmup_inputs, then the evaluations the
    study makes of a run's outputs: the test images with the configuration's TTA, and plain if
    save_plain."""
    data, test_images = inputs
    repository_tail().warm_up(method.train, data, hyp, device, precision,
                              method.source_seeds(0), net, full=True)
    if test_images is None:
        return
    evaluation_logits(method, hyp, net, test_images, hyp['net']['tta_level'], device, precision)
    if save_plain:
        evaluation_logits(method, hyp, net, test_images, 0, device, precision)


def warmup_key(script_path, hyp):
    """What first-call costs (graphs, kernel choices) depend on: script and hyp, not epochs."""
    hyp = copy.deepcopy(hyp)
    hyp['opt'].pop('train_epochs', None)
    return script_path, json.dumps(hyp, sort_keys=True)


class RecompileLimitHit(Exception):
    """torch.compile ran a variant eagerly that a script alone compiles (its recompile limit)."""


class Runner:
    def __init__(self, request, process, world, launch, recompile_limit_hits):
        self.request = request
        self.world = world
        self.launch = launch
        self.recompile_limit_hits = recompile_limit_hits  # studylib.device.recompile_limits's
        self.configs = process.configs
        self.scripts = process.scripts
        self.flags = process.flags  # the flags after --: the same for every configuration
        self.source_seeds = process.scripts[request.script].method.source_seeds  # runs stay paired
        self.device = process.device
        self.precision = process.precision
        data = process.data
        self.device_model = device_model(self.device)
        self.nets = []  # (script, the hyp['net'] entries it was built from, network)
        self.warmed_up = set()  # warmup_key of every (script, hyp) warmed up
        self.variants = ForwardVariants()
        self.compile_records = []  # CompileRecord of each warmup
        self.test_inputs = {}  # the normalized test images by script: the same for every run
        on_device = lambda split: {key: value.to(self.device) for key, value in split.items()}
        self.train_split = on_device(data['train'])
        self.test_split = on_device(data['test'])
        self.data = {key: data[key] for key in ('classes', 'mean', 'std')}
        self.held_out = None
        self.eval_split = self.test_split
        if request.val_split:
            self.held_out = validation_indices(len(data['train']['labels']), request.val_split,
                                               request.seed)
            self.eval_split = {key: value[self.held_out.to(self.device)]
                               for key, value in self.train_split.items()}

    def script(self, config):
        return self.scripts[self.configs[config].script]

    def net(self, config):
        """One network per script and architecture (the hyp['net'] entries build_net reads), shared
        by the configurations that differ in anything else; each run reinitializes it."""
        script = self.script(config)
        arch = self.configs[config].hyp['net']
        for path, entries, net in self.nets:
            if path == script.path and all(arch[key] == value for key, value in entries.items()):
                return net
        seen = EntriesRead(arch)
        net = script.method.build_net(seen, len(self.data['classes']), self.device, self.precision)
        self.nets.append((script.path, {key: arch[key] for key in seen.read}, net))
        return net

    def net_label(self, config):
        net = self.net(config)
        index = next(i for i, (_, _, built) in enumerate(self.nets) if built is net)
        return f'{self.script(config).label} network {index + 1}'

    def warm_up(self, configs):
        """One untimed run on dummy data of every (script, hyp) before the first timed run, with
        its outputs' evaluations: allocation, kernel choices and compilation (or loading it from
        inductor's cache) happen here; their cost goes to self.compile_records."""
        for config in configs:
            script = self.script(config)
            hyp = self.configs[config].hyp
            key = warmup_key(script.path, hyp)
            if key in self.warmed_up or not self.flags.warmup:
                continue
            inputs = warmup_inputs(
                script.method, hyp, len(self.data['classes']), len(self.eval_split['labels']),
                len(self.test_split['labels']) if self.evaluates_test_set() else 0,
                self.data['mean'], self.data['std'], self.precision, self.device)
            counts = compile_counts()
            start = time.perf_counter()
            try:
                with self.variants.recording(self.net(config), self.net_label(config)) as seen:
                    warm_up_network(script.method, hyp, self.net(config), self.device,
                                    self.precision, inputs, self.request.save_logits)
            except Exception as error:  # noqa: BLE001: said in one line, the launch stopped
                reason = self.compiles_eagerly() or f'{type(error).__name__}: {error}'
                raise RunsFailed(f'the warmup of configuration {config} failed ({reason}); no '
                                 'run was trained on this process') from error
            self.compile_records.append(self.compile_record(
                config, 'warmup', time.perf_counter() - start, counts))
            self.variants.warmed_up |= seen
            self.warmed_up.add(key)

    def compile_record(self, config, stage, seconds, counts_before, error=None):
        graphs, compiled, from_cache = (now - before for now, before in
                                        zip(compile_counts(), counts_before))
        return CompileRecord(config=config, launch=self.launch, stage=stage,
                             rank=self.world.rank, host=socket.gethostname(),
                             device=str(self.device), device_model=self.device_model,
                             seconds=seconds, graphs=graphs, compiled=compiled,
                             from_cache=from_cache, error=error)

    def normalized_test_images(self, config):
        script = self.script(config)
        if script.path not in self.test_inputs:
            self.test_inputs[script.path] = normalized_images(
                script.method, self.test_split['images'], self.configs[config].hyp,
                self.data['mean'], self.data['std'], self.precision)
        return self.test_inputs[script.path]

    def logits(self, config, net, tta_level):
        return evaluation_logits(self.script(config).method, self.configs[config].hyp, net,
                                 self.normalized_test_images(config), tta_level, self.device,
                                 self.precision)

    def run_data(self, run):
        """(data, subset mask, subset seed) of a run: its training subset, the evaluated split."""
        request = self.request
        mask = None
        subset_seed = None
        if request.train_subset is not None:
            subset_seed = derived_seed('subset', request.seed + run)
        if request.train_subset is not None or self.held_out is not None:
            held_out = [] if self.held_out is None else self.held_out
            mask = training_mask(len(self.train_split['labels']), held_out, request.train_subset,
                                 subset_seed)
        train_split = self.train_split if mask is None else {
            key: value[mask.to(self.device)] for key, value in self.train_split.items()}
        return {**self.data, 'train': train_split, 'test': self.eval_split}, mask, subset_seed

    def compiles_eagerly(self):
        """Why this process's runs may no longer be compiled as their scripts compile them alone
        (torch.compile hit its recompile limit: new variants run eagerly), or None."""
        hits = self.recompile_limit_hits.hits
        if not hits:
            return None
        return (f'{hits[0]} in this process: torch.compile runs what it has not compiled '
                'eagerly from then on, where each script alone compiles it, so the runs are not '
                'timed (studylib.device.recompile_limits)')

    def run(self, config, run):
        """Train one run: its record, and its outputs (logits, subset mask) as torch.save bytes.
        A run during or after which torch.compile hit its recompile limit raises."""
        try:
            return self.train_run(config, run)
        finally:
            reason = self.compiles_eagerly()
            if reason:
                raise RecompileLimitHit(reason)

    def train_run(self, config, run):
        started = datetime.datetime.now(datetime.timezone.utc).isoformat()
        request = self.request
        script = self.script(config)
        hyp = self.configs[config].hyp
        seeds = run_seeds(self.source_seeds, request.seed, run, request.vary)
        data, mask, subset_seed = self.run_data(run)
        checks = self.flags.warmup and config not in self.variants.checked
        net = self.net(config)
        recording = self.variants.recording(net, self.net_label(config)) if checks else \
            contextlib.nullcontext()
        graphs_before = compile_counts()[0]
        with recording as seen:
            result = script.method.train(data, hyp, self.device, self.precision, seeds, net,
                                         self.flags.epoch_eval)
            graphs = compile_counts()[0] - graphs_before
            outputs, test_acc = self.outputs(config, result['net'], mask)
        unwarmed = self.variants.not_warmed_up(seen) if checks else None
        self.variants.checked.add(config)
        losses = result['epoch_train_losses']
        record = RunRecord(
            config=config, run=run, script=script.label, seed=request.seed + run, seeds=seeds,
            vary=request.vary, subset_seed=subset_seed, accuracy=result['tta_val_acc'],
            accuracy_on='test' if self.held_out is None else 'validation',
            test_acc=result['tta_val_acc'] if test_acc is None else test_acc,
            val_acc=result['val_acc'], total_time_seconds=result['total_time_seconds'],
            steps=result['steps'], graphs_compiled_during_run=graphs,
            forward_variants_not_warmed_up=unwarmed,
            epoch_train_losses=[loss if math.isfinite(loss) else None for loss in losses],
            diverged=not all(map(math.isfinite, losses)), train_images=len(data['train']['labels']),
            rank=self.world.rank, host=socket.gethostname(), device=str(self.device),
            device_model=self.device_model, torch=torch.__version__, launch=self.launch,
            started=started, finished=datetime.datetime.now(datetime.timezone.utc).isoformat())
        buffer = io.BytesIO()
        if outputs:
            torch.save(outputs, buffer)
        return record, buffer.getvalue() or None

    def evaluates_test_set(self):
        """Whether the study evaluates the test set after train(): for saved logits, or for the
        test accuracy where train() evaluated a validation split."""
        return self.request.save_logits or self.held_out is not None

    def test_logits(self, config, net):
        """fp16 test logits with the configuration's TTA, and plain where logits are saved."""
        tta_level = self.configs[config].hyp['net']['tta_level']
        logits = self.logits(config, net, tta_level).half()
        return logits, self.logits(config, net, 0).half() if self.request.save_logits else None

    def outputs(self, config, net, mask):
        """A run's saved outputs (fp16 test logits with and without TTA, kept as computed so that
        they give test_acc exactly; the subset mask), and its TTA test accuracy where train()
        evaluated another split (else None)."""
        outputs = {}
        test_acc = None
        if self.evaluates_test_set():  # test logits: not what train() saw
            logits, plain = self.test_logits(config, net)
            test_acc = (logits.argmax(1) == self.test_split['labels']).float().mean().item()
            if self.request.save_logits:
                outputs['logits'] = logits.cpu()
                outputs['logits_plain'] = plain.cpu()
        if self.request.train_subset is not None:
            outputs['train_mask'] = mask
        return outputs, test_acc
