"""Any 32x32 dataset: the scripts' CIFAR-10 or image folder; study.py's CIFAR-10/100, SVHN, image
folders of several splits, cached."""
import inspect
import os
import types

import pytest
import torch

from conftest import CPU, TINY_WIDTHS, tiny_dataset, write_image_folder
from studylib.hyp import config_hyp, with_entries

import studylib.data  # noqa: E402
import studylib.runs  # noqa: E402
from studylib.data import load_study_data  # noqa: E402
from studylib.cli import parse_flags  # noqa: E402


def test_class_count_comes_from_the_data_and_sets_the_head(ab94, tmp_path):
    root = write_image_folder(str(tmp_path / 'seven'), num_classes=7, train_per_class=4,
                              test_per_class=2)
    data = ab94.load_dataset(root)
    assert data['classes'] == [f'class_{i}' for i in range(7)]
    assert load_study_data('folder', root)['classes'] == data['classes']
    hyp = with_entries(ab94.hyp, {'opt.batch_size': 7, 'opt.train_epochs': 1,
                                  'net.widths': TINY_WIDTHS, 'net.tta_level': 0})
    result = ab94.train(data, hyp, CPU, 'fp32', seed=0, epoch_eval=False)
    assert result['net'][-2].out_features == 7


def test_normalization_constants_for_cifar10_and_computed_otherwise(ab94, tmp_path):
    """study.py: CIFAR-10's for --dataset cifar10, else the training set's; the scripts: an image
    folder's own, whatever it holds."""
    image_folder = write_image_folder(str(tmp_path / 'data'), train_per_class=8, test_per_class=2)
    as_cifar10 = load_study_data('cifar10', image_folder)
    assert as_cifar10['mean'] == ab94.CIFAR10_MEAN and as_cifar10['std'] == ab94.CIFAR10_STD
    as_folder = load_study_data('folder', image_folder)  # the cache is rebuilt: another dataset
    pixels = as_folder['train']['images'].double().div(255).reshape(-1, 3)
    assert as_folder['mean'] == pytest.approx(tuple(pixels.mean(0).tolist()))
    assert as_folder['std'] == pytest.approx(tuple(pixels.std(0).tolist()))
    assert as_folder['mean'] != pytest.approx(ab94.CIFAR10_MEAN, abs=1e-3)
    cached = torch.load(os.path.join(image_folder, 'airbench_cache.pt'), weights_only=True)
    assert cached['mean'] == as_folder['mean']  # the statistics are cached with the data
    scripts = ab94.load_dataset(image_folder)
    assert scripts['mean'] == pytest.approx(as_folder['mean'])
    assert scripts['std'] == pytest.approx(as_folder['std'])
    assert torch.equal(scripts['train']['images'], as_folder['train']['images'])


def test_cinic10_valid_split_joins_training(ab94, tmp_path):
    root = str(tmp_path / 'cinic')
    write_image_folder(root, num_classes=3, train_per_class=4, test_per_class=2)
    write_image_folder(os.path.join(tmp_path, 'other'), num_classes=3, train_per_class=5,
                       test_per_class=1, seed=1)
    os.rename(os.path.join(tmp_path, 'other', 'train'), os.path.join(root, 'valid'))
    train_only = load_study_data('folder', root)
    with_valid = load_study_data('folder', root, train_splits=('train', 'valid'))
    assert len(train_only['train']['labels']) == 12
    assert len(with_valid['train']['labels']) == 12 + 15
    assert torch.equal(with_valid['train']['images'][:12], train_only['train']['images'])


def test_torchvision_datasets_use_training_set_statistics(tmp_path, monkeypatch):
    def fake_read(name, data_dir, download):
        data = tiny_dataset(num_classes=10)
        return {'train': data['train'], 'test': data['test'], 'classes': data['classes']}
    monkeypatch.setattr(studylib.data, 'read_torchvision_dataset', fake_read)
    pixels = tiny_dataset(num_classes=10)['train']['images'].double().div(255).reshape(-1, 3)
    for name in ('cifar100', 'svhn'):
        data = load_study_data(name, str(tmp_path / name))
        assert data['mean'] == pytest.approx(tuple(pixels.mean(0).tolist()))
        assert data['std'] == pytest.approx(tuple(pixels.std(0).tolist()))
        assert os.path.exists(tmp_path / name / 'airbench_cache.pt')


def test_svhn_turns_flipping_off_unless_asked(ab94):
    """Digits are not mirror-symmetric: no flipping, unless a flag or a configuration asks."""
    flips = {}
    for flags, overrides in (([], []), (['--hyp', 'aug.flip=random'], []),
                             ([], ['aug.flip=alternating'])):
        hyp = config_hyp(ab94.hyp, ab94.HYP_CHOICES, ab94.HYP_RANGES,
                         parse_flags(['--dataset', 'svhn', *flags]), overrides)
        flips[(*flags, *overrides)] = hyp['aug']['flip']
    assert flips == {(): 'none', ('--hyp', 'aug.flip=random'): 'random',
                     ('aug.flip=alternating',): 'alternating'}
    hyp = config_hyp(ab94.hyp, ab94.HYP_CHOICES, ab94.HYP_RANGES, parse_flags([]))
    assert hyp['aug']['flip'] == 'alternating'


def test_the_default_data_directory_is_named_by_the_dataset_and_no_other_is_changed():
    assert parse_flags(['--dataset', 'svhn']).data_dir == 'data/svhn'
    assert parse_flags(['--dataset', 'svhn', '--data-dir', '/mnt/DATASETS/x']).data_dir == \
        '/mnt/DATASETS/x'


def test_the_warmups_test_set_takes_the_batch_sizes_infer_meets(ab94):
    """One full batch of infer's default size and the rest, as the real test set; a copy whose
    infer has no batch_size, the whole split at once."""
    data, test_images = studylib.runs.warmup_inputs(ab94, ab94.hyp, 10, 2100, 0, (0.5,) * 3,
                                                    (0.25,) * 3, 'fp32', CPU)
    eval_batch = inspect.signature(ab94.infer).parameters['batch_size'].default
    assert len(data['test']['labels']) == eval_batch + 2100 % eval_batch and test_images is None
    assert len(data['train']['labels']) == 2 * ab94.hyp['opt']['batch_size']

    def infer_of_a_copy(net, images, tta_level, autocast):
        return net(images)
    copy = types.SimpleNamespace(infer=infer_of_a_copy, CifarLoader=ab94.CifarLoader)
    data, test_images = studylib.runs.warmup_inputs(copy, ab94.hyp, 10, 2100, 300, (0.5,) * 3,
                                                    (0.25,) * 3, 'fp32', CPU)
    assert len(data['test']['labels']) == 2100 and test_images.shape == (300, 3, 32, 32)
