"""tools/graph_inventory.py: every graph of a compiled script's CUDA warmup, what it is, its
operators and its calls in a run after it. Slow: the whole schedule, compiled as on CUDA."""
import pytest

from conftest import load_tool

graph_inventory = load_tool('graph_inventory')


@pytest.mark.slow
def test_airbench94_compiled_every_graph_its_calls_and_operators():
    """Batches of 8 (48 steps per epoch, as CIFAR-10's at 1024), 4 epochs, 2100 test images: the
    training graphs called at every step (the bias trainable for 3 epochs), evaluation's graphs
    (2000 and the remainder, 100) once per epoch untimed and 6 times in the timed TTA, the
    augmentation once per epoch; each compiled in the warmup, each call counting its operators."""
    options = graph_inventory.parse_args(['airbench94_compiled', '--precision', 'fp32',
                                          '--test-images', '2100', '--epochs', '4'])
    result = graph_inventory.inventory('airbench94_compiled', options)
    graphs = {graph['graph']: graph for graph in result['graphs']}
    assert sorted(graphs) == ['augmentation', 'evaluation, batch 100, whitening bias frozen',
                              'evaluation, batch 2000, whitening bias frozen',
                              'training, batch 8, whitening bias frozen',
                              'training, batch 8, whitening bias trainable']
    assert all(graph['compiled_in'] == 'warmup' for graph in graphs.values())
    calls = {name: (graph['calls_run_timed'], graph['calls_run_untimed'])
             for name, graph in graphs.items()}
    assert result['steps'] == 4 * 48
    assert calls == {'augmentation': (4, 0),
                     'evaluation, batch 100, whitening bias frozen': (6, 4),
                     'evaluation, batch 2000, whitening bias frozen': (6, 4),
                     'training, batch 8, whitening bias frozen': (48, 0),
                     'training, batch 8, whitening bias trainable': (3 * 48, 0)}
    for graph in graphs.values():
        operators = graph['forward_operators'] + graph.get('backward_operators', 0)
        assert 0 < graph['forward_operators'] and graph['operators_run_timed'] == (
            operators * graph['calls_run_timed'])
    assert 'backward_operators' in graphs['training, batch 8, whitening bias frozen']
    assert 'backward_operators' not in graphs['evaluation, batch 2000, whitening bias frozen']
