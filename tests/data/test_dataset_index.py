"""Packed dataset indexes: the same samples as the list-based loaders, one build per node through
the cache, and forked workers that share the index instead of copying it."""

from __future__ import annotations

import json
import logging
import multiprocessing
import os
import pickle
import shutil
import time
from collections import namedtuple

import numpy as np
import pytest
import yaml
from ppdist_testing import HANG_TIMEOUT_S as HANG_S
from torch.utils.data import DataLoader, Dataset

import ppdist.data.rec as rec_module
from ppdist.benchmark.scale_data import write_label_file
from ppdist.builder import build_component
from ppdist.data.base import BadSample
from ppdist.data.det import COCODataSet
from ppdist.data.index_cache import BUILDS, cache_folder
from ppdist.data.packed import IndexFileError, PackedIndex
from ppdist.data.rec import SimpleDataSet
from ppdist.errors import ConfigError
from ppdist.registry import DATASETS
from ppdist.utils.memory import memory_kib

FIXTURE = os.path.join(os.path.dirname(__file__), "..", "fixtures", "dataset_index")


@pytest.fixture()
def fixture_dir(tmp_path, monkeypatch):
    """A copy of the fixture's inputs as the working directory (messages name them relatively)."""
    shutil.copytree(os.path.join(FIXTURE, "inputs"), tmp_path / "inputs")
    monkeypatch.chdir(tmp_path)
    with open(os.path.join(FIXTURE, "expected.json")) as handle:
        return json.load(handle)


@pytest.mark.parametrize("cache", ["off", "auto", "auto-again"])
def test_label_files_give_the_samples_of_the_list_based_loader(fixture_dir, cache):
    for expected in fixture_dir["rec"]:
        for _ in range(2 if cache == "auto-again" else 1):  # again: the second maps the first's file
            ds = SimpleDataSet(
                "inputs",
                ["inputs/a.txt", "inputs/b.txt"],
                [],
                mode="train",
                cache=cache.split("-")[0],
                **expected["case"],
            )
        assert (ds.lines.index.path is None) == (cache == "off")
        got = []
        for i in range(len(ds)):
            line = ds._line(i)
            error = None
            if not line.ok:  # reported once with its location: "file:line: malformed line: why"
                bad = ds.load(i)
                assert isinstance(bad, BadSample)
                error = str(bad)
            got.append([ds.origin(i), line.path, line.label, line.ok, error])
        assert got == expected["samples"], expected["case"]


@pytest.mark.parametrize("cache", ["off", "auto", "auto-again"])
def test_coco_json_gives_the_samples_of_the_list_based_loader(fixture_dir, cache, caplog):
    for expected in fixture_dir["coco"]:
        for _ in range(2 if cache == "auto-again" else 1):  # again: the second maps the first's file
            caplog.clear()
            with caplog.at_level(logging.WARNING, logger="ppdist"):
                ds = COCODataSet(
                    "inputs", "images", "instances.json", [], cache=cache.split("-")[0], **expected["case"]
                )
        assert (ds.index.path is None) == (cache == "off")
        got = []
        for i in range(len(ds)):
            rows = slice(int(ds.index["box_start"][i]), int(ds.index["box_start"][i + 1]))
            got.append(
                [
                    ds.image_id(i),
                    float(ds.index["height"][i]),
                    float(ds.index["width"][i]),
                    os.path.relpath(ds.image_path(i), "inputs"),
                    ds.index["gt_bbox"][rows].tolist(),
                    ds.index["gt_class"][rows].tolist(),
                    ds.index["is_crowd"][rows].tolist(),
                    ds.origin(i).replace(os.path.abspath("inputs"), "inputs"),
                ]
            )
        assert got == expected["samples"], expected["case"]
        assert ds.label_list == expected["label_list"]
        assert sorted(ds.clsid2catid.items()) == [tuple(p) for p in expected["clsid2catid"]]
        assert ds.dropped_annotations == expected["dropped"]
        assert ds.num_empty_images == expected["num_empty_images"]
        warnings = [r.getMessage().replace(os.path.abspath("inputs"), "inputs") for r in caplog.records]
        assert [w for w in warnings if "not loaded" in w] == expected["log"]


def test_packed_index_round_trip_and_pickling(tmp_path):
    arrays = {
        "a": np.arange(10, dtype=np.int64),
        "b": np.zeros((0, 4), np.float32),
        "c": np.array([[1.5, 2.5]], np.float64),
    }
    index = PackedIndex(arrays, {"x": [1, "y"]})
    path = str(tmp_path / "i.idx")
    index.save(path, key={"k": 1})
    loaded = PackedIndex.load(path)
    assert loaded.meta == {"x": [1, "y"]} and loaded.key == {"k": 1} and loaded.path == path
    for name, array in arrays.items():
        assert loaded[name].dtype == array.dtype and np.array_equal(loaded[name], array)
    assert not loaded["a"].flags.writeable  # a read-only map of the file
    assert len(pickle.dumps(loaded)) < 200  # a mapped index travels as its path
    assert np.array_equal(pickle.loads(pickle.dumps(loaded))["c"], arrays["c"])
    assert np.array_equal(pickle.loads(pickle.dumps(index))["a"], arrays["a"])  # in memory: its arrays
    with open(path, "r+b") as handle:
        handle.truncate(os.path.getsize(path) - 70)
    with pytest.raises(IndexFileError, match="truncated"):
        PackedIndex.load(path)
    (tmp_path / "other.idx").write_bytes(b"not an index")
    with pytest.raises(IndexFileError, match="not a ppdist index"):
        PackedIndex.load(str(tmp_path / "other.idx"))


def test_datasets_with_a_mapped_index_pickle_small(fixture_dir, tmp_path):
    """A spawned worker gets the cache file's path and maps it, not a copy of the arrays."""
    rec = SimpleDataSet("inputs", ["inputs/a.txt"], [], cache=str(tmp_path / "c"))
    coco = COCODataSet("inputs", "images", "instances.json", [], mode="eval", cache=str(tmp_path / "c"))
    for dataset in (rec, coco):
        again = pickle.loads(pickle.dumps(dataset))
        assert len(again) == len(dataset) and again.origin(3) == dataset.origin(3)
    rec_off = SimpleDataSet("inputs", ["inputs/a.txt"], [], cache="off")
    assert len(pickle.dumps(rec)) < 2000 < len(pickle.dumps(rec_off))


def _labels(tmp_path, lines=50):
    os.makedirs(tmp_path / "data", exist_ok=True)
    path = str(tmp_path / "train.txt")
    write_label_file(path, lines, seed=1)
    return str(tmp_path / "data"), path


def _counts(fn):
    before = dict(BUILDS)
    result = fn()
    return result, {k: BUILDS[k] - before[k] for k in BUILDS}


def test_cache_is_reused_rebuilt_when_stale_and_keyed_by_options(tmp_path):
    data_dir, path = _labels(tmp_path)
    cache = str(tmp_path / "cache")

    def build(**kw):
        kw.setdefault("cache", cache)
        return _counts(lambda: SimpleDataSet(data_dir, [path], [], **kw))

    first, counts = build()
    assert counts == {"built": 1, "mapped": 0} and len(os.listdir(cache)) == 2  # the index and its lock
    again, counts = build()
    assert counts == {"built": 0, "mapped": 1} and again.lines.index.path == first.lines.index.path
    _, counts = build(ratio_list=0.5)
    assert counts == {"built": 1, "mapped": 0}  # other options: another file
    with open(path, "a") as handle:
        handle.write("new/line.jpg\tnew\n")
    changed, counts = build()
    assert counts == {"built": 1, "mapped": 0} and len(changed) == len(first) + 1
    assert changed.origin(len(changed) - 1).endswith("(new/line.jpg)")
    assert len([n for n in os.listdir(cache) if n.endswith(".idx")]) == 2  # the stale file was replaced
    _, counts = build(cache="off")
    assert counts == {"built": 1, "mapped": 0}
    with pytest.raises(ConfigError, match="Train.dataset.cache"):
        build(cache=3)


def test_unwritable_cache_folder_builds_in_memory_with_a_warning(tmp_path, caplog):
    data_dir, path = _labels(tmp_path)
    blocked = tmp_path / "file_not_folder"
    blocked.write_text("")
    with caplog.at_level(logging.WARNING, logger="ppdist"):
        ds = SimpleDataSet(data_dir, [path], [], cache=str(blocked / "cache"))
    assert len(ds) == 50 and ds.lines.index.path is None
    assert any(
        "not writable" in r.getMessage() and "PPDIST_CACHE_DIR" in r.getMessage() for r in caplog.records
    )


def test_cache_auto_folder_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("PPDIST_CACHE_DIR", str(tmp_path / "x"))
    assert cache_folder("auto", "k") == str(tmp_path / "x") and cache_folder("off", "k") is None


def _slow_build(*args, **kwargs):
    time.sleep(1.0)  # the other process arrives while this one builds
    return _ORIGINAL_BUILD(*args, **kwargs)


_ORIGINAL_BUILD = rec_module.build_label_index


def _rank(data_dir, path, cache, queue):
    before = dict(BUILDS)
    ds = SimpleDataSet(data_dir, [path], [], cache=cache)
    queue.put(({k: BUILDS[k] - before[k] for k in BUILDS}, ds.origin(7), ds.lines.index.path))


def test_ranks_of_a_node_parse_once_and_a_restart_maps_the_file(tmp_path, monkeypatch):
    data_dir, path = _labels(tmp_path, lines=2000)
    cache = str(tmp_path / "cache")
    monkeypatch.setattr(rec_module, "build_label_index", _slow_build)
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    ranks = [context.Process(target=_rank, args=(data_dir, path, cache, queue)) for _ in range(3)]
    for process in ranks:
        process.start()
    results = [queue.get(timeout=HANG_S) for _ in ranks]
    for process in ranks:
        process.join(timeout=HANG_S)
        assert process.exitcode == 0
    assert sorted(r[0]["built"] for r in results) == [0, 0, 1]  # one parse; the others waited and mapped
    assert len({(r[1], r[2]) for r in results}) == 1
    restart = context.Process(target=_rank, args=(data_dir, path, cache, queue))
    restart.start()
    counts, origin, mapped = queue.get(timeout=HANG_S)
    restart.join(timeout=HANG_S)
    assert counts == {"built": 0, "mapped": 1} and (origin, mapped) == results[0][1:]


class TouchEveryRecord(Dataset):
    """One item: a worker reads every record (not its image) and reports its private memory growth."""

    def __init__(self, records, count):
        self.records, self.count = records, count

    def __len__(self):
        return 1

    def __getitem__(self, _):
        start = memory_kib()
        for i in range(self.count):
            self.records(i)
        end = memory_kib()
        return end["Private_Dirty"] - start["Private_Dirty"]


def _worker_private_growth_kib(records, count):
    loader = DataLoader(TouchEveryRecord(records, count), batch_size=None, num_workers=1)
    return int(next(iter(loader)))


Line = namedtuple("Line", "file line_no path label ok")


@pytest.mark.skipif(not os.path.exists("/proc/self/smaps_rollup"), reason="needs Linux smaps_rollup")
@pytest.mark.slow
def test_forked_workers_share_the_index_instead_of_copying_it(tmp_path):
    count = 300_000
    data_dir, path = _labels(tmp_path, lines=count)
    ds = SimpleDataSet(data_dir, [path], [], cache="off")  # in memory: fork's copy-on-write is the test
    assert len(ds) == count
    shared = _worker_private_growth_kib(ds.origin, count)
    # the control: the same lines as a list of Python records, as before the packed index
    lines = [Line(0, i + 1, *ds._line(i)[2:]) for i in range(count)]
    copied = _worker_private_growth_kib(lambda i: lines[i].label, count)
    assert copied > 20_000, copied  # refcount updates dirty every page of the list's objects
    assert shared < 2_000, shared  # the index pages stay shared (measured: ~150 KiB, the list: ~47 MB)
    mapped = SimpleDataSet(data_dir, [path], [], cache=str(tmp_path / "cache"))
    assert (
        _worker_private_growth_kib(mapped.origin, count) < 2_000
    )  # the file's pages: shared by every process


@pytest.mark.parametrize("name", ["SimpleDataSet", "COCODataSet"])
def test_cache_off_written_in_yaml_is_accepted(fixture_dir, name):
    """YAML reads an unquoted ``off`` as false: ``cache: off`` (and ``-o ...cache=off``) turns the
    index cache off instead of being refused as a bool."""
    entry = yaml.safe_load(f"name: {name}\ncache: off\n")
    assert entry["cache"] is False
    if name == "SimpleDataSet":
        entry.update(data_dir="inputs", label_file_list=["inputs/a.txt"])
    else:
        entry.update(dataset_dir="inputs", image_dir="images", anno_path="instances.json")
    dataset = build_component(DATASETS, entry, {"Global": {}}, "Train.dataset", transforms=[])
    assert len(dataset) > 0
    assert len(pickle.dumps(dataset)) > 2000  # the index travels in memory: no cache file was used


def _cached_labels(data_dir, path, cache):
    return SimpleDataSet(data_dir, [path], [], cache=cache)


def _rebuild_warnings(caplog):
    return [r.getMessage() for r in caplog.records if "rebuilding" in r.getMessage()]


def test_cache_file_with_changed_bytes_is_rebuilt_not_served(tmp_path, caplog):
    """4 bytes changed in the arrays of a cache file: the checksum no longer matches, the index is
    rebuilt (one log line) instead of serving another label."""
    data_dir, path = _labels(tmp_path)
    cache = str(tmp_path / "cache")
    first = _cached_labels(data_dir, path, cache)
    label = first._line(3).label
    cache_path = first.lines.index.path
    with open(cache_path, "rb") as handle:
        raw = handle.read()
    at = raw.rindex(label.encode())  # the label's bytes in the mapped text buffer
    with open(cache_path, "r+b") as handle:  # in place, as a disk error would
        handle.seek(at)
        handle.write(b"XXXX")
    with caplog.at_level(logging.INFO, logger="ppdist"):
        again, counts = _counts(lambda: _cached_labels(data_dir, path, cache))
    assert counts == {"built": 1, "mapped": 0} and again._line(3).label == label
    warnings = _rebuild_warnings(caplog)
    assert len(warnings) == 1 and "checksum" in warnings[0] and cache_path in warnings[0], warnings
    _, counts = _counts(lambda: _cached_labels(data_dir, path, cache))
    assert counts == {"built": 0, "mapped": 1}  # the rebuilt file is good


@pytest.mark.parametrize(
    "damage",
    [
        lambda raw: raw.replace(b'"<i8"', b'"<q8"', 1),  # an unknown dtype (was: a config error)
        lambda raw: raw.replace(b'"shape": [', b'"shape": [-', 1),  # a negative shape
        lambda raw: raw[:15] + (2**60).to_bytes(8, "little") + raw[23:],  # a header length past the file
        lambda raw: raw[:100],  # truncated inside the header
        lambda raw: b"",  # empty
    ],
    ids=["dtype", "shape", "length", "truncated", "empty"],
)
def test_cache_file_with_a_corrupted_header_is_rebuilt(tmp_path, caplog, damage):
    data_dir, path = _labels(tmp_path)
    cache = str(tmp_path / "cache")
    first = _cached_labels(data_dir, path, cache)
    cache_path = first.lines.index.path
    expected = [first.origin(i) for i in range(len(first))]
    with open(cache_path, "rb") as handle:
        raw = handle.read()
    with open(cache_path + ".tmp", "wb") as handle:  # a new file: ``first`` keeps its mapping
        handle.write(damage(raw))
    os.replace(cache_path + ".tmp", cache_path)
    with caplog.at_level(logging.INFO, logger="ppdist"):
        again, counts = _counts(lambda: _cached_labels(data_dir, path, cache))
    assert counts == {"built": 1, "mapped": 0}
    assert [again.origin(i) for i in range(len(again))] == expected
    assert len(_rebuild_warnings(caplog)) == 1, _rebuild_warnings(caplog)


def test_label_file_edited_in_place_with_its_mtime_restored_is_rebuilt(tmp_path):
    """Same size, same mtime, other content: the key holds ctime and inode, so it is not served stale."""
    data_dir, path = _labels(tmp_path)
    cache = str(tmp_path / "cache")
    first = _cached_labels(data_dir, path, cache)
    label = first._line(0).label
    before = os.stat(path)
    with open(path, "r+b") as handle:  # edited in place: same inode, same size
        raw = handle.read()
        handle.seek(raw.index(label.encode()))
        handle.write(b"Z" * len(label.encode()))
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = os.stat(path)
    assert (after.st_size, after.st_mtime_ns) == (before.st_size, before.st_mtime_ns)
    again, counts = _counts(lambda: _cached_labels(data_dir, path, cache))
    assert counts == {"built": 1, "mapped": 0} and again._line(0).label == "Z" * len(label)
    replaced = tmp_path / "replacement.txt"  # another file moved over it, size and mtime kept
    replaced.write_bytes(raw)
    os.utime(replaced, ns=(before.st_atime_ns, before.st_mtime_ns))
    os.replace(replaced, path)
    again, counts = _counts(lambda: _cached_labels(data_dir, path, cache))
    assert counts == {"built": 1, "mapped": 0} and again._line(0).label == label
