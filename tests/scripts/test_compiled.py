"""The scripts compiled on CUDA: airbench94_compiled trains as airbench94 does; in it and in the
Muon scripts every graph is static and compiled in the warmup. Compiling takes minutes on a CPU."""
import pytest
import torch
from torch import nn

from conftest import (QUICK, QUICK_HYP, TINY_WIDTHS, compile_with_backend, load_script, set_hyp,
                      summary_of, tiny_dataset, tiny_hyp, warm_up_as_on_cuda)

# Compiled kernels sum in another order: per-epoch losses differed by at most 1.6e-5 relative in
# fp32 (3.0e-4 under the bf16 autocast of a CPU with native bf16); another method moves them 1e-2
LOSS_RTOL = 1e-4

pytestmark = pytest.mark.slow


def record_compiled_graphs(monkeypatch):
    """torch.compile records each graph (its tensor inputs' shapes) and runs it eagerly."""
    graphs = []

    def recording_backend(graph_module, example_inputs):
        graphs.append([tuple(t.shape) for t in example_inputs if isinstance(t, torch.Tensor)])
        return graph_module.forward

    compile_with_backend(monkeypatch, recording_backend)
    return graphs


def test_compiled_matches_eager(image_folder, tmp_path, monkeypatch):
    outcomes = {}
    for name in ('airbench94', 'airbench94_compiled'):
        script = load_script(name)
        monkeypatch.setattr(script, 'precision_for', lambda device: 'fp32')
        set_hyp(monkeypatch, script, tiny_hyp(name), QUICK_HYP)
        assert script.main(['--data-dir', image_folder, '--runs', '2', '--seed', '7',
                            '--log-dir', str(tmp_path / name), *QUICK]) == 0
        outcomes[name] = summary_of(tmp_path / name)
    for eager_run, compiled_run in zip(outcomes['airbench94']['runs'],
                                       outcomes['airbench94_compiled']['runs']):
        assert eager_run['seed'] == compiled_run['seed']
        for a, b in zip(eager_run['epoch_train_losses'], compiled_run['epoch_train_losses']):
            assert abs(a - b) <= LOSS_RTOL * abs(a)


# The paper's ablations: without whitening the first conv trains throughout (no freeze: one
# training graph), the others add none; 2 epochs do, and flip-only TTA
ABLATIONS = {'net.whiten': False, 'net.identity_init': False, 'opt.lookahead_every': 0,
             'opt.sampling': 'replacement', 'opt.bias_scaler': 1, 'net.tta_level': 1}
# The scalars of Muon's whole step (one graph): its lr; airbench94_hiverge's renormalization too
STEP_SCALARS = {'airbench94_compiled': None, 'airbench94_muon': 1, 'airbench94_hiverge': 2}


@pytest.mark.parametrize('name, entries, num_test, epochs, network', [
    # training's batches of 32 (trainable, frozen), evaluation's 2000 and 100
    ('airbench94_compiled', {}, 2100, 4, [32, 32, 2000, 100]),
    ('airbench94_compiled', ABLATIONS, 2100, 2, [32, 2000, 100]),
    # evaluation's one batch, before and after the freeze
    ('airbench94_muon', {'opt.whiten_bias_epochs': 1}, 64, 2, [32, 32, 64]),
    # also the selective TTA's views of 500 and of the remainder's quarter; with 1.5 epochs of
    # the bias's training an epoch's evaluation comes before the freeze
    ('airbench94_hiverge', {}, 2100, 2, [32, 32, 2000, 100, 6 * 500, 6 * 100 // 4]),
    ('airbench94_hiverge', {'opt.whiten_bias_epochs': 1.5}, 4100, 2,
     [32, 32, 2000, 100, 6 * 500, 6 * 100 // 4])])
def test_every_graph_static_and_compiled_in_the_warmup(name, entries, num_test, epochs, network,
                                                        tmp_path, monkeypatch):
    """What compiles on CUDA, forced on the CPU, each graph once in the warmup, none in the timed
    run (on another number of training images). Static shapes: a batch size met second would
    recompile a graph with a symbolic one. Each graph of the network is the whole network from
    the images on (docs/tests.md, "Torch versions"): training's with its loss, per whitening-bias
    state; evaluation's per batch size, TTA's views in it. One more, the augmentation's, serves
    any number of images (the warmup's 64, the run's 128); and one, Muon's whole step."""
    torch._dynamo.reset()  # graphs of earlier tests would count toward dynamo's recompile limit
    script = load_script(name)
    graphs = record_compiled_graphs(monkeypatch)
    monkeypatch.setattr(script, 'compiles', lambda device: True, raising=False)
    warmed = warm_up_as_on_cuda(monkeypatch, script, graphs)
    data = tiny_dataset(per_class=64)
    test = tiny_dataset(per_class=num_test // 2)['train']
    monkeypatch.setattr(script, 'load_dataset', lambda *args, **kwargs: {**data, 'test': test})
    monkeypatch.setattr(script, 'precision_for', lambda device: 'fp32')
    set_hyp(monkeypatch, script, tiny_hyp(name), entries)
    assert script.main(['--runs', '1', '--seed', '0', '--epochs', str(epochs), '--device', 'cpu',
                        '--log-dir', str(tmp_path)]) == 0
    scalars = STEP_SCALARS[name]
    assert warmed == [len(graphs)]  # none compiled when timed
    assert len(graphs) == len(network) + 1 + (scalars is not None)
    augmentation = [shapes for shapes in graphs if (64, 3, 36, 36) in shapes]
    assert len(augmentation) == 1  # the warmup's 64 padded training images
    arch = script.hyp['net']
    net = script.make_net(TINY_WIDTHS, 2, arch['batchnorm_momentum'], arch['scaling_factor'])
    banks = [tuple(m.weight.shape) for m in net.modules()
             if isinstance(m, nn.Conv2d) and m.kernel_size == (3, 3)]
    # Muon's step: the banks' weights, gradients and momentum buffers, and its scalars
    steps = [shapes for shapes in graphs if sorted(shapes) == sorted(banks * 3 + [()] * (
        scalars or 0))]
    assert len(steps) == (scalars is not None)
    graphs = [shapes for shapes in graphs if shapes not in augmentation + steps]
    images = [[shape for shape in shapes if shape[1:] == (3, 32, 32)] for shapes in graphs]
    assert all(len(batch) == 1 for batch in images)  # every graph starts from the images
    assert sorted(batch[0][0] for batch in images) == sorted(network)
    assert [(32,) in shapes for shapes in graphs].count(True) == network.count(32)  # labels
    symbolic = [size for shapes in graphs for shape in shapes for size in shape
                if isinstance(size, torch.SymInt)]
    assert symbolic == []
