"""BaseDataSet: per-sample seeding, worker-count independence, bad-sample handling, collate."""

import random

import numpy as np
import pytest
import torch
from ppdist_testing import tiny_run_config
from torch.utils.data import DataLoader

from ppdist.data.base import BAD_SAMPLES_KEY, SAMPLE_INDEX_KEY, BadSample, BaseDataSet
from ppdist.data.build import build_dataloader, collate
from ppdist.data.samplers import TrainBatchSampler
from ppdist.errors import DataError


class NoisyNumbers(BaseDataSet):
    """Sample i is ``i`` plus random noise from all three RNGs; index 3 is unreadable."""

    def __init__(self, mode="train", n=12):
        super().__init__([self.add_noise], mode)
        self.n = n

    def __len__(self):
        return self.n

    def origin(self, index):
        return f"list.txt:{index + 1}"

    def read(self, index):
        if index == 3:
            raise FileNotFoundError("img3.jpg")
        return {"x": np.array([float(index)])}

    @staticmethod
    def add_noise(data):
        data["x"] = data["x"] + random.random() + np.random.rand() + torch.rand(1).item()
        return data


def values(num_workers, epoch=0, seed=7):
    sampler = TrainBatchSampler(12, 4, shuffle=True, seed=seed)
    sampler.set_epoch(epoch)
    loader = DataLoader(NoisyNumbers(), batch_sampler=sampler, num_workers=num_workers, collate_fn=collate)
    return torch.cat([b["x"] for b in loader]).flatten().tolist()


def test_augmentation_independent_of_workers_and_varies_with_epoch():
    assert values(0) == values(2)
    assert values(0, epoch=1) != values(0, epoch=0)
    assert values(0, seed=8) != values(0, seed=7)


def test_main_process_rng_untouched():
    torch.manual_seed(0)
    expected = torch.rand(1)
    torch.manual_seed(0)
    NoisyNumbers()[(5, 0, 1)]
    assert torch.equal(torch.rand(1), expected)


def test_train_replaces_bad_sample_and_reports_it():
    item = NoisyNumbers("train")[(3, 0, 0)]
    assert 4.0 <= item["x"][0] < 7.0  # index 4 took its place
    assert item[BAD_SAMPLES_KEY] == ["list.txt:4: FileNotFoundError: img3.jpg"]


def test_eval_skips_bad_sample_and_collate_reports_it():
    ds = NoisyNumbers("eval")
    batch = collate([ds[(i, 0, 0)] for i in (2, 3, 4)])
    assert batch["x"].shape == (2, 1)
    assert batch[BAD_SAMPLES_KEY] == ["list.txt:4: FileNotFoundError: img3.jpg"]
    assert isinstance(ds[(3, 0, 0)], BadSample)
    assert batch[SAMPLE_INDEX_KEY].tolist() == [2, 4]  # the kept samples' dataset indices
    assert SAMPLE_INDEX_KEY not in collate([NoisyNumbers("train")[(i, 0, 0)] for i in (2, 3)])


class _PickOneSize:
    """A batch op: one random size for the whole batch."""

    batch_op = True

    def __call__(self, samples):
        size = int(np.random.randint(0, 1000))
        return [dict(s, size=np.array([size])) for s in samples]


class _AddOne:
    def __call__(self, sample):
        return dict(sample, x=sample["x"] + 1)


def test_batch_transforms_get_the_batch_and_are_seeded_by_its_samples():
    from ppdist.data.base import SAMPLE_SEED_KEY

    def samples(seeds):
        return [{"x": np.array([i]), SAMPLE_SEED_KEY: s} for i, s in enumerate(seeds)]

    ops = [_PickOneSize(), _AddOne()]
    np.random.seed(1)
    a = collate(samples([11, 12]), ops)
    np.random.seed(2)
    b = collate(samples([11, 12]), ops)
    assert a["size"].tolist() == b["size"].tolist() and len(set(a["size"].reshape(-1).tolist())) == 1
    assert a["x"].tolist() == [[1], [2]]
    assert SAMPLE_SEED_KEY not in a


def test_samples_seed_only_the_cpu_generator(monkeypatch):
    """torch.manual_seed would reseed CUDA's generators too (not restored after main-process
    loading; a stack capture per call in a CUDA build): loading must not touch them."""

    def forbidden(*args, **kwargs):
        raise AssertionError("sample loading reseeded the CUDA generators")

    monkeypatch.setattr(torch.cuda, "manual_seed_all", forbidden)
    monkeypatch.setattr(torch.cuda, "manual_seed", forbidden)
    first = NoisyNumbers()[(5, 0, 1)]["x"]
    assert np.array_equal(first, NoisyNumbers()[(5, 0, 1)]["x"])  # still seeded per sample
    batch = collate([NoisyNumbers()[(i, 0, 1)] for i in (0, 1)], batch_ops=[NoisyNumbers.add_noise])
    assert batch["x"].shape == (2, 1)


def test_worker_init_sets_opencv_threads():
    import cv2

    from ppdist.data.build import WorkerInit

    before, torch_threads = cv2.getNumThreads(), torch.get_num_threads()
    try:
        WorkerInit(seed=1, rank=0, cv2_num_threads=3)(0)
        assert cv2.getNumThreads() == 3 and torch.get_num_threads() == 1
        WorkerInit(seed=1, rank=0)(0)
        assert cv2.getNumThreads() == 1  # 0 = OpenCV without its thread pool (it reports 1)
    finally:
        cv2.setNumThreads(before)
        torch.set_num_threads(torch_threads)


def test_loader_options_defaults_and_overrides():
    from ppdist.data.build import loader_options

    base = {"num_workers": 2, "pin_memory": None, "persistent_workers": None, "prefetch_factor": None}
    assert loader_options(base, "cuda") == {"pin_memory": True, "persistent_workers": True}
    assert loader_options(base, "cpu") == {"pin_memory": False, "persistent_workers": True}
    custom = dict(base, pin_memory=False, persistent_workers=False, prefetch_factor=4)
    assert loader_options(custom, "cuda") == {
        "pin_memory": False,
        "persistent_workers": False,
        "prefetch_factor": 4,
    }
    assert loader_options(dict(custom, num_workers=0), "cuda") == {"pin_memory": False}  # no worker options


class MostlyBad(BaseDataSet):
    """Only the indices in ``good`` can be read (e.g. a long run of missing images)."""

    def __init__(self, n, good):
        super().__init__([], "train")
        self.n, self.good = n, set(good)

    def __len__(self):
        return self.n

    def read(self, index):
        if index not in self.good:
            raise FileNotFoundError(f"img{index}.jpg")
        return {"x": np.array([float(index)])}


def test_a_long_run_of_bad_samples_is_bridged_in_training():
    dataset = MostlyBad(40, good=[30, 31])  # 30 bad lines in a row, as an unshuffled list may have
    items = [dataset[(i, 0, 0)] for i in range(40)]
    assert all(isinstance(item, dict) for item in items)
    assert items[0]["x"][0] == 30.0 and items[0][BAD_SAMPLES_KEY] == ["sample 0: FileNotFoundError: img0.jpg"]


def test_a_training_set_without_any_usable_sample_says_so():
    item = MostlyBad(5, good=[])[(2, 0, 0)]
    assert isinstance(item, BadSample) and "no sample of the data set is usable" in item.reason


def test_an_empty_training_label_file_is_named(tmp_path, digits_dir):
    empty = tmp_path / "empty.txt"
    empty.write_text("\n", encoding="utf-8")
    config = tiny_run_config(tmp_path, digits_dir, overrides=[f"Train.dataset.label_file_list=[{empty}]"])
    with pytest.raises(DataError, match=f"Train.dataset has no sample \\({empty}\\)"):
        build_dataloader(config, "Train", "train")


class Images(BaseDataSet):
    """Sample i is a [3, H, W] image of the i-th size; ``min_image_size`` set by the test."""

    sizes = [(40, 40), (28, 200), (200, 28), (29, 29)]

    def __init__(self, mode):
        super().__init__([], mode)

    def __len__(self):
        return len(self.sizes)

    def origin(self, index):
        return f"val.txt:{index + 1} (img{index}.png)"

    def read(self, index):
        return {"image": np.zeros((3, *self.sizes[index]), np.float32)}


def test_an_image_under_the_models_smallest_input_is_a_bad_sample_naming_it():
    dataset = Images("eval")
    assert all(isinstance(dataset[i], dict) for i in range(4))  # no minimum: every size passes
    dataset.min_image_size = (29, 29)
    results = [dataset[i] for i in range(4)]
    assert [isinstance(r, dict) for r in results] == [True, False, False, True]
    assert str(results[1]) == (
        "val.txt:2 (img1.png): the image is 28x200 (HxW) after the transforms, smaller than the model's smallest "
        "input 29x29; resize it in the transforms or leave it out"
    )
    assert "200x28 (HxW)" in str(results[2])
    batch = collate(results[1:3])
    assert batch[BAD_SAMPLES_KEY] == [str(results[1]), str(results[2])]


def test_a_too_small_training_image_is_replaced_and_reported():
    dataset = Images("train")
    dataset.min_image_size = (29, 29)
    sample = dataset[(1, 0, 0)]
    assert sample["image"].shape == (3, 29, 29)  # the next usable one (index 2 is 200x28)
    assert sample[BAD_SAMPLES_KEY] == [
        "val.txt:2 (img1.png): the image is 28x200 (HxW) after the transforms, smaller than the model's smallest "
        "input 29x29; resize it in the transforms or leave it out"
    ]
