"""BatchIterator: each sample once per epoch, drop_last, seeds, checks."""

from __future__ import annotations

import pytest
import torch

from osfl.data import BatchIterator, ImageSet
from osfl.data.loader import DeviceLoader, client_loader
from osfl.errors import DataError


def data(n: int = 10) -> tuple[torch.Tensor, torch.Tensor]:
    """Image i is filled with i and has label i, so a batch says which samples it holds."""
    images = torch.arange(n, dtype=torch.uint8).view(n, 1, 1, 1).expand(n, 1, 2, 2).contiguous()
    return images, torch.arange(n, dtype=torch.int64)


def epoch(it: BatchIterator) -> list[torch.Tensor]:
    out = []
    for x, y in it:
        assert x.dtype == torch.uint8 and y.dtype == torch.int64 and x.device.type == "cpu"
        assert torch.equal(x[:, 0, 0, 0].long(), y)  # images and labels stay paired
        out.append(y)
    return out


def test_every_sample_once_per_epoch_with_short_last_batch():
    it = BatchIterator(*data(10), 3, generator=torch.Generator().manual_seed(0))
    assert len(it) == 4
    batches = epoch(it)
    assert [len(b) for b in batches] == [3, 3, 3, 1]
    assert sorted(torch.cat(batches).tolist()) == list(range(10))


def test_drop_last():
    it = BatchIterator(*data(10), 3, drop_last=True, generator=torch.Generator().manual_seed(0))
    assert len(it) == 3
    seen = torch.cat(epoch(it)).tolist()
    assert len(seen) == 9 and len(set(seen)) == 9
    assert len(BatchIterator(*data(2), 3, drop_last=True)) == 0
    assert len(BatchIterator(*data(9), 3, drop_last=True)) == 3


def test_seeded_and_new_permutation_each_epoch():
    a = BatchIterator(*data(50), 8, generator=torch.Generator().manual_seed(1))
    b = BatchIterator(*data(50), 8, generator=torch.Generator().manual_seed(1))
    ea1, ea2 = torch.cat(epoch(a)), torch.cat(epoch(a))
    eb1, eb2 = torch.cat(epoch(b)), torch.cat(epoch(b))
    assert torch.equal(ea1, eb1) and torch.equal(ea2, eb2)
    assert not torch.equal(ea1, ea2)
    c = BatchIterator(*data(50), 8, generator=torch.Generator().manual_seed(2))
    assert not torch.equal(torch.cat(epoch(c)), ea1)


def test_no_shuffle_keeps_order():
    it = BatchIterator(*data(7), 4, shuffle=False)
    assert torch.cat(epoch(it)).tolist() == list(range(7))


def test_from_imageset_with_client_indices():
    images, labels = data(10)
    s = ImageSet(images=images, labels=labels, classes=tuple(str(i) for i in range(10)))
    it = BatchIterator.from_imageset(
        s, 2, indices=[7, 2, 5], generator=torch.Generator().manual_seed(0)
    )
    assert it.num_samples == 3 and len(it) == 2
    assert sorted(torch.cat(epoch(it)).tolist()) == [2, 5, 7]


def test_empty_set_has_no_batches():
    it = BatchIterator(*data(0), 4)
    assert len(it) == 0 and list(it) == []


@pytest.mark.parametrize("bs", [0, -1, 2.5, True, "8"])
def test_bad_batch_size_refused(bs):
    with pytest.raises(DataError, match="batch_size must be a positive integer"):
        BatchIterator(*data(4), bs)


def test_mismatched_lengths_and_bad_generator_refused():
    images, labels = data(4)
    with pytest.raises(DataError, match="same number of samples"):
        BatchIterator(images, labels[:3], 2)
    with pytest.raises(DataError, match=r"torch\.Generator"):
        BatchIterator(images, labels, 2, generator=0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_device_with_cpu_generator_matches_cpu_order():
    cpu = BatchIterator(*data(20), 6, generator=torch.Generator().manual_seed(3))
    gpu = BatchIterator(*data(20), 6, generator=torch.Generator().manual_seed(3), device="cuda")
    for (xc, yc), (xg, yg) in zip(cpu, gpu, strict=True):
        assert xg.device.type == "cuda" and torch.equal(yg.cpu(), yc) and torch.equal(xg.cpu(), xc)


def test_client_loader_is_the_plain_loader_on_the_cpu_and_refuses_what_cannot_train():
    """Both training loops draw a client's batches through ``client_loader``:
    on the CPU the plain BatchIterator; the device path's DeviceLoader draws
    the same permutations from the same CPU generator."""
    images, labels = data(10)
    classes = tuple(str(i) for i in range(10))
    cpu = torch.device("cpu")
    loader = client_loader(ImageSet(images, labels, classes), 4, False, torch.Generator(), cpu)
    assert type(loader) is BatchIterator and len(loader) == 3
    plain = BatchIterator(images, labels, 4, generator=torch.Generator().manual_seed(5))
    device = DeviceLoader(images, labels, 4, generator=torch.Generator().manual_seed(5))
    for a, b in zip(epoch(plain), epoch(device), strict=True):
        assert torch.equal(a, b)
    with pytest.raises(DataError, match="empty"):
        client_loader(ImageSet(images[:0], labels[:0], classes), 4, False, torch.Generator(), cpu)
    with pytest.raises(DataError, match="drop_last=false"):
        client_loader(ImageSet(images, labels, classes), 16, True, torch.Generator(), cpu)
