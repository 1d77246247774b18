"""tools/same_seed.py: a script's fingerprint from one seed, and the comparison that says which
scripts changed what they compute."""
import json

import pytest
import torch
from torch import nn

from conftest import tiny_dataset

import same_seed


def fingerprints(**scripts):
    return dict(torch='2.x', threads=2, settings=dict(images=8, seed=5, epochs=1, batch_size=4),
                scripts=scripts)


RUN = dict(epoch_train_losses=[2.19], val_acc=0.28, tta_val_acc=0.29, steps=4, state_sha256='ab')


def test_the_comparison_names_each_script_and_field_that_differ():
    before = fingerprints(airbench94=RUN, airbench95=RUN)
    after = fingerprints(airbench94=RUN, airbench95={**RUN, 'state_sha256': 'cd',
                                                     'epoch_train_losses': [2.1900001]})
    assert same_seed.differences(before, before) == []
    assert same_seed.differences(before, after) == [
        'airbench95: epoch_train_losses, state_sha256 differ']


@pytest.mark.parametrize('key, value', [
    ('torch', '2.y'), ('threads', 1), ('settings', dict(images=8, seed=6, epochs=1, batch_size=4))])
def test_fingerprints_made_otherwise_are_refused(key, value):
    before = fingerprints(airbench94=RUN)
    after = {**before, key: value}
    assert same_seed.settings_clash(before, before) is None
    assert f'made with {key}' in same_seed.settings_clash(before, after)


def test_the_slice_is_a_seeded_draw_from_each_split():
    data = tiny_dataset(num_classes=4, per_class=16)
    first = same_seed.data_slice(data, 10)
    again = same_seed.data_slice(data, 10)
    assert len(first['train']['labels']) == len(first['test']['labels']) == 10
    assert torch.equal(first['train']['images'], again['train']['images'])
    assert len(set(first['train']['labels'].tolist())) > 1  # not the folder's first class alone
    assert len(same_seed.data_slice(data, 1000)['test']['labels']) == 64


def test_the_hash_sees_one_bit_of_the_state():
    net = nn.Linear(3, 2)
    before = same_seed.state_hash(net)
    net.weight.detach().view(torch.int32)[0, 0] ^= 1
    assert same_seed.state_hash(net) != before


def test_bad_flags_are_refused_in_one_line(capsys):
    with pytest.raises(SystemExit):
        same_seed.parse_args(['airbench97', '--data-dir', 'D'])
    assert 'unknown script airbench97' in capsys.readouterr().err


@pytest.mark.slow
def test_the_same_command_twice_gives_the_same_fingerprint(image_folder, tmp_path, capsys):
    flags = ['airbench94', '--data-dir', image_folder, '--images', '64', '--batch-size', '32']
    out = tmp_path / 'before.json'
    assert same_seed.main([*flags, '--out', str(out)]) == 0
    assert same_seed.main([*flags, '--compare', str(out)]) == 0
    assert capsys.readouterr().out.strip().endswith('the same in all 1 scripts')
    doctored = json.loads(out.read_text())
    doctored['scripts']['airbench94']['tta_val_acc'] += 0.001
    out.write_text(json.dumps(doctored))
    assert same_seed.main([*flags, '--compare', str(out)]) == 1
    assert 'airbench94: tta_val_acc differ' in capsys.readouterr().out
    with pytest.raises(SystemExit, match='made with settings'):
        same_seed.main([*flags, '--seed', '6', '--compare', str(out)])
