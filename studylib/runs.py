"""Training the runs of a study on this process's device: the data of each run (subset, validation
split), the warmup of every network before the first timed run, and each run's record and
outputs."""
import copy
import datetime
import hashlib
import io
import json
import math
import socket

import torch

from .environment import device_model
from .plan import run_seeds


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


def warmup_key(script_path, hyp):
    """What first-call costs depend on (compiled graphs, kernel choices): the script and its hyp,
    whatever the number of epochs."""
    hyp = copy.deepcopy(hyp)
    hyp['opt'].pop('train_epochs', None)
    return script_path, json.dumps(hyp, sort_keys=True)


class Runner:
    """Trains runs of the study on this process's device and makes their records."""

    def __init__(self, args, process, world, launch):
        self.args, self.world, self.launch = args, world, launch
        self.configs = process.configs
        self.source_seeds = process.main_script.source_seeds  # one for all: runs stay paired
        self.device, self.precision, data = process.device, process.precision, process.data
        self.nets, self.warmed_up = {}, set()  # networks by (script, architecture), reinitialized
        on_device = lambda split: {key: value.to(self.device) for key, value in split.items()}
        self.train_split, self.test_split = on_device(data['train']), on_device(data['test'])
        self.data = {key: data[key] for key in ('classes', 'mean', 'std')}
        self.held_out, self.eval_split = None, self.test_split
        if args.val_split:
            self.held_out = validation_indices(len(data['train']['labels']), args.val_split,
                                               args.seed)
            self.eval_split = {key: value[self.held_out.to(self.device)]
                               for key, value in self.train_split.items()}

    def net(self, config):
        script, hyp = self.configs[config]['module'], self.configs[config]['hyp']
        key = (self.configs[config]['path'], json.dumps(hyp['net'], sort_keys=True))
        if key not in self.nets:
            self.nets[key] = script.build_net(hyp['net'], len(self.data['classes']), self.device,
                                              self.precision)
        return self.nets[key]

    def warm_up(self, configs):
        """Before the first timed run, one untimed run on dummy data of every (script, hyp) that
        the study will train: allocation, kernel choices and compilation happen here."""
        for config in configs:
            script, hyp = self.configs[config]['module'], self.configs[config]['hyp']
            key = warmup_key(self.configs[config]['path'], hyp)
            if key in self.warmed_up or not self.configs[config]['args'].warmup:
                continue
            dummy = script.dummy_dataset(len(self.data['classes']), hyp['opt']['batch_size'],
                                         len(self.eval_split['labels']), self.device)
            script.train(dummy, hyp, self.device, self.precision, self.source_seeds(0),
                         self.net(config), epoch_eval=self.configs[config]['args'].epoch_eval)
            self.warmed_up.add(key)

    def logits(self, config, net, images, tta_level):
        """A trained network's logits (fp32) for uint8 images, normalized by the script's own
        loader, as train() normalizes its test images."""
        script, hyp = self.configs[config]['module'], self.configs[config]['hyp']
        dtype = torch.float16 if self.precision == 'fp16' else torch.float32
        loader = script.CifarLoader(images, None, len(images), self.data['mean'],
                                    self.data['std'], hyp['aug'], dtype)
        inputs = loader.normalize(loader.images)
        autocast = torch.autocast(self.device.type, dtype=torch.bfloat16,
                                  enabled=(self.precision == 'bf16'))
        return script.infer(net, inputs, tta_level, autocast)

    def run_data(self, record):
        """The data of a run (its training subset, the evaluated split) and its subset mask."""
        args, mask = self.args, None
        if args.train_subset is not None:
            record['subset_seed'] = derived_seed('subset', args.seed + record['run'])
        if args.train_subset is not None or self.held_out is not None:
            mask = training_mask(len(self.train_split['labels']),
                                 [] if self.held_out is None else self.held_out, args.train_subset,
                                 record.get('subset_seed'))
        train_split = self.train_split if mask is None else {
            key: value[mask.to(self.device)] for key, value in self.train_split.items()}
        return {**self.data, 'train': train_split, 'test': self.eval_split}, mask

    def run(self, config, run):
        """Train one run: its record, and its outputs (logits, subset mask) as torch.save bytes."""
        args, entry = self.args, self.configs[config]
        script, hyp = entry['module'], entry['hyp']
        seeds = run_seeds(self.source_seeds, args.seed, run, args.vary)
        record = dict(config=config, run=run, script=entry['label'], seed=args.seed + run,
                      seeds=seeds, vary=args.vary)
        data, mask = self.run_data(record)
        graphs_before = script.compiled_graph_count()
        result = script.train(data, hyp, self.device, self.precision, seeds, self.net(config),
                              entry['args'].epoch_eval)
        losses = result['epoch_train_losses']
        record.update(
            accuracy=result['tta_val_acc'],  # what the statistics are of
            accuracy_on='test' if self.held_out is None else 'validation',
            test_acc=result['tta_val_acc'], val_acc=result['val_acc'],
            total_time_seconds=result['total_time_seconds'], steps=result['steps'],
            graphs_compiled_during_run=script.compiled_graph_count() - graphs_before,
            epoch_train_losses=[loss if math.isfinite(loss) else None for loss in losses],
            diverged=not all(map(math.isfinite, losses)), train_images=len(data['train']['labels']))
        outputs = self.outputs(config, result['net'], record, mask)
        record.update(rank=self.world.rank, host=socket.gethostname(), device=str(self.device),
                      device_model=device_model(self.device), torch=torch.__version__,
                      launch=self.launch,
                      finished=datetime.datetime.now(datetime.timezone.utc).isoformat())
        buffer = io.BytesIO()
        if outputs:
            torch.save(outputs, buffer)
        return record, buffer.getvalue() or None

    def outputs(self, config, net, record, mask):
        """The saved outputs of a run: test logits with and without TTA in fp16 (kept as computed,
        so that they give test_acc exactly), and the subset mask."""
        outputs = {}
        if self.args.save_logits or self.held_out is not None:  # test logits: not what train() saw
            tta_level = self.configs[config]['hyp']['net']['tta_level']
            images, labels = self.test_split['images'], self.test_split['labels']
            logits = self.logits(config, net, images, tta_level).half()
            record['test_acc'] = (logits.argmax(1) == labels).float().mean().item()
            if self.args.save_logits:
                outputs['logits'] = logits.cpu()
                outputs['logits_plain'] = self.logits(config, net, images, 0).half().cpu()
        if self.args.train_subset is not None:
            outputs['train_mask'] = mask
        return outputs
