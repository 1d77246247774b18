"""Every graph a compiled script's warmup compiles on CUDA, what it is and what it saves per run.

Each script runs as main() runs it on CUDA: the network built once, main()'s CUDA warmup
(warm_up(..., full=True): training past the whitening bias's freeze, the test set evaluated),
then one train() with its per-epoch evaluation; compiles(device) is forced where a script compiles
on CUDA only, and the CUDA recipe's fp16 is kept (--precision). torch.compile keeps dynamo and
AOTAutograd, as inductor traces, and runs each graph's ATen operators (aot_eager's way), so the
graphs, their operators and their calls are those of CUDA. For each graph, in the order compiled:
what it is (the augmentation, Muon's step, or the network: training, with its loss and backward,
or evaluation, at a batch size, with the whitening bias trainable or frozen), the ATen operators in
its forward and backward that do work (each at least one kernel launch on CUDA, run eagerly
without the graph; views and allocations not counted, as tools/profile_run.py counts), its calls
in the warmup and in the run, timed (training steps, the epochs' augmentation, the TTA) and not
(the per-epoch evaluation), and so the operators it saves per run. --inductor compiles with
inductor on this machine instead (a cold cache: a new directory), in its default mode (the CPU's;
CUDA's max-autotune tries kernels on a GPU, no figure of it here), and gives each graph's compile
seconds (dynamo's trace and inductor's forward, then its backward, which inductor compiles at the
first backward call); the run after the warmup is then left out.

Small and quick, as tools/profile_run.py count: random images, batches of --batch-size (8) in
place of the script's, block widths --widths (2,8,8), as many training images as give the
script's steps per epoch on CIFAR-10 (50,000 // its batch size), its whole schedule (or
--epochs), and --test-images (10,000, CIFAR-10's) test images. The operators per call do not
depend on the batch size or the widths; the calls per run depend on the steps and the test set.

Usage: python tools/graph_inventory.py SCRIPT [SCRIPT ...] [--precision fp16] [--batch-size 8]
                                       [--widths 2,8,8] [--test-images 10000] [--epochs E]
                                       [--inductor]
e.g.   python tools/graph_inventory.py airbench94_compiled --inductor --precision fp32
(docs/cpu.md, "The compiled scripts' graphs"). Each script is counted in a process of its own.
"""
import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile
import time

import torch

TOOLS = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(TOOLS)
sys.path.insert(0, TOOLS)
from flops import load_script  # noqa: E402  (tools/flops.py)
from profile_run import launches_no_kernel  # noqa: E402  (tools/profile_run.py)

CIFAR_TRAIN = 50000
KINDS = {'augmented_images': 'augmentation', 'muon_update': "Muon's step"}


def working_operators(graph_module):
    """The ATen operators of an AOTAutograd graph that do work on the device."""
    return sum(node.op == 'call_function' and isinstance(node.target, torch._ops.OpOverload)
               and not launches_no_kernel('aten::' + node.target._schema.name.partition('::')[2])
               for node in graph_module.graph.nodes)


class Inventory:
    """The graphs compiled, each with what it is, its operators and its calls by phase."""

    def __init__(self, inductor):
        self.inductor = inductor
        self.graphs = []
        self.backends = {}  # one per function: dynamo recompiles a function for another backend
        self.net = None
        self.phase = 'warmup'
        self.timed = False

    def compile(self, model=None, *, mode=None, options=None, backend=None, **kwargs):
        """torch.compile's stand-in: this inventory's backend, which knows the function compiled."""
        name = getattr(model, '__name__', type(model).__name__)
        if name not in self.backends:
            self.backends[name] = lambda gm, inputs: self.backend(gm, inputs, name)
        return ORIGINAL_COMPILE(model, backend=self.backends[name], **kwargs)

    def what(self, name, inputs):
        if name in KINDS:
            return KINDS[name]
        images = [shape for shape in inputs if shape[1:] == [3, 32, 32]]
        mode = 'training' if torch.is_grad_enabled() else 'evaluation'
        bias = 'trainable' if self.net[0].bias.requires_grad else 'frozen'
        return f'{mode}, batch {images[0][0]}, whitening bias {bias}'

    def backend(self, graph_module, example_inputs, name):
        from torch._dynamo.utils import compilation_time_metrics
        inputs = [list(t.shape) for t in example_inputs if isinstance(t, torch.Tensor)]
        # the frame's entry in dynamo's compile times comes when its compile ends: the next one
        frame = len(compilation_time_metrics.get('_compile.compile_inner', []))
        graph = dict(graph=self.what(name, inputs), inputs=inputs, compiled_in=self.phase,
                     frame=frame, calls=collections.Counter())
        self.graphs.append(graph)
        if self.inductor:
            from torch._inductor.compile_fx import compile_fx, compile_fx_inner
            return compile_fx(graph_module, example_inputs,
                              inner_compile=self.timed_compile(graph, compile_fx_inner))
        from torch._dynamo.backends.common import aot_autograd
        return aot_autograd(fw_compiler=self.counted(graph, 'forward'),
                            bw_compiler=self.counted(graph, 'backward'),
                            keep_inference_input_mutations=True)(graph_module, example_inputs)

    def counted(self, graph, part):
        """AOTAutograd's compiler of a graph's part: its operators counted, its calls too."""
        def compiler(graph_module, example_inputs):
            from functorch.compile import make_boxed_func
            graph[f'{part}_operators'] = working_operators(graph_module)
            run_graph = graph_module.forward

            def run(*args):
                graph['calls'][part, self.phase, self.timed] += 1
                return run_graph(*args)
            return make_boxed_func(run)
        return compiler

    def timed_compile(self, graph, inner):
        """inductor's compile_fx_inner, timed, by the part of the graph it compiles."""
        def compile_inner(graph_module, example_inputs, **kwargs):
            part = 'backward' if kwargs.get('is_backward') else 'forward'
            start = time.perf_counter()
            compiled = inner(graph_module, example_inputs, **kwargs)
            graph[f'{part}_inductor_seconds'] = time.perf_counter() - start
            return compiled
        return compile_inner


ORIGINAL_COMPILE = torch.compile


def run_data(num_train, num_test):
    generator = torch.Generator().manual_seed(0)
    data = {split: {'images': torch.randint(0, 256, (n, 32, 32, 3), dtype=torch.uint8,
                                            generator=generator),
                    'labels': torch.randint(0, 10, (n,), generator=generator)}
            for split, n in (('train', num_train), ('test', num_test))}
    return dict(data, classes=[str(c) for c in range(10)], mean=(0.4914, 0.4822, 0.4465),
                std=(0.2470, 0.2435, 0.2616))


def warm_up_and_run(module, recorder, options):
    """main()'s CUDA warmup, then one run with its per-epoch evaluation (none with --inductor):
    (the warmup's seconds, the run's steps)."""
    class Clock(module.DeviceClock):  # its marks alternate: timed from each even one to the next
        def mark(self):
            recorder.timed = not recorder.timed
            super().mark()
    module.DeviceClock = Clock
    hyp = {group: dict(values) for group, values in module.hyp.items()}
    num_train = CIFAR_TRAIN // hyp['opt']['batch_size'] * options.batch_size
    hyp['opt']['batch_size'] = options.batch_size
    hyp['net']['widths'] = dict(zip(('block1', 'block2', 'block3'), options.widths))
    if options.epochs:
        hyp['opt']['train_epochs'] = options.epochs
    data = run_data(num_train, options.test_images)
    cpu = torch.device('cpu')
    torch._dynamo.reset()
    recorder.net = module.build_net(hyp['net'], len(data['classes']), cpu, options.precision)
    start = time.perf_counter()
    module.warm_up(data, hyp, cpu, options.precision, 0, recorder.net, full=True)
    warmup_seconds = time.perf_counter() - start
    if options.inductor:
        return warmup_seconds, None
    recorder.phase = 'run'
    recorder.timed = False
    return warmup_seconds, module.train(data, hyp, cpu, options.precision, 1, recorder.net)['steps']


def inventory(name, options):
    """[graph, ...] of the script's warmup, each with its calls in the warmup and the run."""
    from torch._dynamo.utils import compilation_time_metrics
    if options.inductor:  # a cold cache
        os.environ['TORCHINDUCTOR_CACHE_DIR'] = tempfile.mkdtemp(prefix='graph_inventory_')
    module = load_script(name)
    if hasattr(module, 'compiles'):  # compiled on CUDA only: the CUDA path's decision
        module.compiles = lambda device: True
    recorder = Inventory(options.inductor)
    torch.compile = recorder.compile
    try:
        warmup_seconds, steps = warm_up_and_run(module, recorder, options)
    finally:
        torch.compile = ORIGINAL_COMPILE
    frames = compilation_time_metrics.get('_compile.compile_inner', [])
    graphs = []
    for graph in recorder.graphs:
        calls = graph.pop('calls')
        for phase, timed in (('warmup', None), ('run', True), ('run', False)):
            key = phase if timed is None else f"{phase}_{'timed' if timed else 'untimed'}"
            graph[f'calls_{key}'] = sum(n for (part, p, t), n in calls.items() if part ==
                                        'forward' and p == phase and timed in (None, t))
            graph[f'operators_{key}'] = sum(n * graph.get(f'{part}_operators', 0)
                                            for (part, p, t), n in calls.items()
                                            if p == phase and timed in (None, t))
        if options.inductor:  # the frame's dynamo and forward compile, then the backward's
            graph['compile_seconds'] = (frames[graph['frame']] +
                                        graph.get('backward_inductor_seconds', 0))
        graphs.append(graph)
    return dict(script=name, torch=torch.__version__, steps=steps, graphs=graphs,
                warmup_seconds=warmup_seconds)


def table(result, inductor):
    header = ['#', 'graph']
    header += ['compile s'] if inductor else [
        'ATen operators (forward + backward)', 'calls in the warmup', 'calls per run, timed',
        'untimed', 'operators per run, timed', 'untimed']
    lines = ['| ' + ' | '.join(header) + ' |', '|' + '---|' * len(header)]
    for index, graph in enumerate(result['graphs'], 1):
        when = '' if graph['compiled_in'] == 'warmup' else ' (compiled in the run)'
        row = [index, graph['graph'] + when]
        if inductor:
            row.append(f"{graph['compile_seconds']:.1f}")
        else:
            operators = f"{graph['forward_operators']}"
            if 'backward_operators' in graph:
                operators += f" + {graph['backward_operators']}"
            row += [operators, graph['calls_warmup'], graph['calls_run_timed'],
                    graph['calls_run_untimed'], graph['operators_run_timed'],
                    graph['operators_run_untimed']]
        lines.append('| ' + ' | '.join(map(str, row)) + ' |')
    steps = '' if result['steps'] is None else f", {result['steps']} steps per run"
    return (f"{result['script']} (torch {result['torch']}{steps}; the warmup "
            f"{result['warmup_seconds']:.1f} s)\n" + '\n'.join(lines))


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('scripts', nargs='+', metavar='SCRIPT')
    parser.add_argument('--precision', default='fp16', choices=['fp16', 'bf16', 'fp32'])
    parser.add_argument('--batch-size', type=int, default=8)
    parser.add_argument('--widths', default='2,8,8',
                        type=lambda text: [int(w) for w in text.split(',')])
    parser.add_argument('--test-images', type=int, default=10000)
    parser.add_argument('--epochs', type=float, help="the run's epochs (default: the script's)")
    parser.add_argument('--inductor', action='store_true',
                        help="compile with inductor on this machine, timing each graph's compile")
    parser.add_argument('--json', action='store_true', help=argparse.SUPPRESS)  # one process's
    return parser.parse_args(argv)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    options = parse_args(argv)
    if options.json:  # inside the process of one script
        print(json.dumps(inventory(options.scripts[0], options)))
        return 0
    flags = [arg for arg in argv if arg not in options.scripts]
    for name in options.scripts:
        done = subprocess.run([sys.executable, os.path.abspath(__file__), name, *flags, '--json'],
                              capture_output=True, text=True)
        if done.returncode != 0:
            sys.exit(f'error: {name}: {done.stderr.strip().splitlines()[-1]}')
        print(table(json.loads(done.stdout.strip().splitlines()[-1]), options.inductor) + '\n',
              flush=True)
    return 0


if __name__ == '__main__':
    sys.exit(main())
