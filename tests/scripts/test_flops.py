"""Training FLOPs counted from the built networks against the paper's figures."""
import pytest

import flops as flops_tool

# The exact count (the steps as run, plus TTA) against the paper: 94 is required within 3%, 95,
# 96 and the later records (0.29 and 3.1, their authors' figures) within 5%. Measured: 0.350 vs
# 0.36 (-2.8%), 1.338 vs 1.4 (-4.4%), 7.232 vs 7.2 (+0.4%), 0.291 vs 0.29 (+0.3%), 3.157 vs 3.1
# (+1.9%; how airbench96_faster's proxy counts: below).
TOLERANCE = {'airbench94': 0.03, 'airbench95': 0.05, 'airbench96': 0.05, 'airbench94_muon': 0.05,
             'airbench96_faster': 0.05}


@pytest.fixture(scope='module')
def figures():
    """Probed on one image: the counts per image are those of any batch."""
    return {name: flops_tool.run_flops(flops_tool.load_script(name), probe_batch=1)
            for name in [*flops_tool.PAPER_PFLOPS, 'airbench94_hiverge']}


@pytest.mark.parametrize('name', list(TOLERANCE))
def test_training_flops_match_the_paper(name, figures):
    counted = figures[name]
    paper = flops_tool.PAPER_PFLOPS[name] * 1e15
    assert abs(counted['exact'] - paper) / paper < TOLERANCE[name]
    assert abs(counted['conventional'] - paper) / paper < 0.03
    # The frozen whitening layer and the dropped partial batch (none at batch 2000) make each count
    # smaller than the next
    assert counted['exact'] < counted['conventional'] <= counted['nominal']
    partial_batch = 50000 % flops_tool.load_script(name).hyp['opt']['batch_size'] > 0
    assert (counted['conventional'] < counted['nominal']) == partial_batch


def test_airbench96_count_supports_the_papers_7_2_not_7_5(figures):
    exact = figures['airbench96']['exact'] / 1e15
    nominal = figures['airbench96']['nominal'] / 1e15
    assert abs(exact - 7.2) < abs(exact - 7.5)
    assert abs(nominal - 7.5) < abs(nominal - 7.2)  # the README's 7.5 counts 50,000 images x 40


def test_hiverge_counts_its_selective_tta_and_padded_orthogonalization_as_run(figures):
    """airbench94_hiverge has no published FLOPs figure: its count is checked against its schedule
    (245 steps of 1536, the whitening bias trained for 7) and its selective TTA (every test image
    once, six views of the least confident 2500); measured 0.263 PFLOPs, Newton-Schulz 0.0028."""
    script = flops_tool.load_script('airbench94_hiverge')
    counted = figures['airbench94_hiverge']
    forward, with_bias, without_bias = flops_tool.network_flops(script, script.hyp['net'], 10, 1)
    assert counted['steps'] == 245
    tta = (10000 + 6 * 2500) * forward
    assert counted['exact'] == pytest.approx(1536 * (7 * with_bias + 238 * without_bias) + tta)
    assert counted['conventional'] == pytest.approx(3 * forward * 1536 * 245 + tta)
    assert abs(counted['exact'] / 1e15 - 0.263) < 0.002
    # The six banks padded to 256 x 2304: per iteration x x^T, (x x^T)^2 and that times x
    per_iteration = 6 * 2 * (2 * 256 * 256 * 2304 + 256**3)
    assert counted['newton_schulz'] == 245 * 3 * per_iteration
    # fewer FLOPs than the Muon record: 0.263 vs 0.291
    assert counted['exact'] < figures['airbench94_muon']['exact']


def test_airbench96_faster_counts_its_proxys_passes_and_steps(figures):
    """2160 forward passes of the proxy on 1024 images, of which every fourth (540) a training
    step, counted 3 x forward conventionally (measured 0.113 PFLOPs of the 3.167); the main
    network's steps on the selected 512 images of each batch."""
    faster = flops_tool.load_script('airbench96_faster')
    counted = figures['airbench96_faster']
    assert flops_tool.PAPER_PFLOPS['airbench96_faster'] == 3.1
    proxy_forward = flops_tool.network_flops(faster, faster.hyp['proxy'], 10, 1)[0]
    assert counted['proxy_conventional'] == pytest.approx(
        1024 * proxy_forward * (1620 + 3 * 540))
    assert 0.1e15 < counted['proxy_conventional'] < 0.12e15
    main = counted['forward_per_image'] * (3 * 512 * 2160 + 6 * 10000)  # steps, then TTA
    assert counted['conventional'] == pytest.approx(main + counted['proxy_conventional'])
