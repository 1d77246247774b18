"""Bad input gets a clear message naming the problem and the fix, never a deep traceback."""
import os

import pytest

from conftest import write_image_folder
from test_end_to_end import run_script


def test_missing_data_without_network_says_how_to_provide_it(ab94, tmp_path):
    with pytest.raises(ab94.DataError) as error:
        ab94.load_cifar10(str(tmp_path / 'nothing'), download=False)
    message = str(error.value)
    assert 'No CIFAR-10 found' in message and '--data-dir' in message and 'image-folder' in message


def test_images_not_32x32_are_refused(ab94, tmp_path):
    root = write_image_folder(str(tmp_path / 'big'), num_classes=2, train_per_class=2,
                              test_per_class=1, size=40)
    with pytest.raises(ab94.DataError, match='40x40 pixels.*32x32.*do not resize'):
        ab94.load_cifar10(root)


def test_train_and_test_class_sets_must_match(ab94, tmp_path):
    root = write_image_folder(str(tmp_path / 'mismatch'), num_classes=3, train_per_class=2,
                              test_per_class=1)
    os.rename(os.path.join(root, 'test', 'class_2'), os.path.join(root, 'test', 'class_9'))
    with pytest.raises(ab94.DataError, match=r"only in train: \['class_2'\]; only in test: \['class_9'\]"):
        ab94.load_cifar10(root)


def test_corrupt_cache_is_rebuilt(ab94, image_folder):
    first = ab94.load_cifar10(image_folder)
    cache = os.path.join(image_folder, 'airbench_cache.pt')
    with open(cache, 'r+b') as f:
        f.truncate(100)
    messages = []
    second = ab94.load_cifar10(image_folder, log=messages.append)
    assert any('unreadable' in m and 'rebuilding' in m for m in messages)
    assert (second['train']['images'] == first['train']['images']).all()
    assert os.path.getsize(cache) > 100


@pytest.mark.parametrize('flags, message', [
    (['--runs', '0'], '--runs must be at least 1'),
    (['--epochs', '0'], '--epochs must be a positive number'),
    (['--epochs', '-2'], '--epochs must be a positive number'),
    (['--device', 'toaster'], "--device 'toaster' is not a device"),
    (['--hyp', 'opt.learning_rate=3'], "no such hyperparameter"),
    (['--hyp', 'opt.lr'], '--hyp takes KEY=VALUE'),
])
def test_nonsensical_flags(flags, message, tmp_path):
    result = run_script('airbench94', '--data-dir', str(tmp_path), *flags, timeout=120)
    assert result.returncode != 0
    assert message in result.stderr
    assert 'Traceback' not in result.stderr


def test_cuda_requested_but_absent(tmp_path):
    import torch
    if torch.cuda.is_available():
        pytest.skip('this machine has CUDA')
    result = run_script('airbench94', '--device', 'cuda', '--data-dir', str(tmp_path), timeout=120)
    assert result.returncode != 0 and 'sees no CUDA device' in result.stderr
    assert 'Traceback' not in result.stderr
