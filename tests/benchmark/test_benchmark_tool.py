"""tools/benchmark.py end to end on a tiny CRNN: every measurement runs and counts what it should."""

import json
import os

import pytest
from ppdist_testing import HANG_TIMEOUT_S, check_ok, run_tool, tiny_config

from ppdist.benchmark.workers import auto_workers


@pytest.mark.slow
def test_benchmark_reports_every_measurement(tmp_path, digits_dir):
    cfg = tiny_config(str(tmp_path / "t.yml"), digits_dir, str(tmp_path / "o"), epochs=1)
    out = tmp_path / "bench.json"
    result = check_ok(
        run_tool(
            [
                "benchmark.py",
                "-c",
                cfg,
                "-o",
                "Global.synthetic_data=null",
                "Global.static_graph=true",
                "Global.gradient_as_bucket_view=true",
                "Global.bucket_cap_mb=5",
                "--iters",
                "3",
                "--warmup",
                "2",
                "--nproc",
                "2",
                "--scaling_threads",
                "1",
                "--infer_dir",
                os.path.join(digits_dir, "images", "val"),
                "--infer_images",
                "10",
                "--output_dir",
                str(tmp_path / "bench"),
                "--json",
                str(out),
            ],
            timeout=HANG_TIMEOUT_S,
        )
    )
    data = json.loads(out.read_text())
    batch = 16
    # trainer and bare loop: the same 3 timed steps of 16 samples after 2 warm-up steps
    assert data["trainer"]["steps"] == 3 and data["trainer"]["samples"] == 3 * batch
    assert data["bare_loop"]["steps"] == 3 and data["bare_loop"]["samples"] == 3 * batch
    trainer, bare = data["trainer"], data["bare_loop"]
    assert data["trainer_overhead"] == trainer["median_samples_per_s"] / bare["median_samples_per_s"]
    assert data["trainer_overhead_window"] == trainer["samples_per_s"] / bare["samples_per_s"]
    assert trainer["median_samples_per_s"] == 16 / trainer["median_step_s"]
    assert 0 <= data["trainer"]["reader_fraction"] < 1
    # loader workers sized from the cores (--workers auto), not the config's 1
    assert data["loader"]["samples"] == 3 * batch and data["loader"]["num_workers"] == auto_workers(1)
    # scaling: 1 process, then 2 under torchrun with the DDP switches of the overrides
    scaling = data["scaling"]
    assert scaling["single"]["world_size"] == 1 and scaling["multi"]["world_size"] == 2
    assert scaling["multi"]["samples"] == 3 * batch * 2
    assert scaling["multi"]["ddp"] == {
        "gradient_as_bucket_view": True,
        "static_graph": True,
        "bucket_cap_mb": 5.0,
        "find_unused_parameters": False,
    }
    assert (
        scaling["speedup"]
        == scaling["multi"]["median_samples_per_s"] / scaling["single"]["median_samples_per_s"]
    )
    # eval over the whole val set (51 lines), infer over 10 files
    assert data["eval"]["samples"] == 51 and set(data["eval"]["metric"]) == {"acc"}
    assert data["infer"]["images"] == 10 and data["infer"]["images_per_s"] > 0
    env = data["environment"]
    assert (
        env["channels_last"] is True and env["compile"] == "off" and env["train_workers"] == auto_workers(1)
    )
    assert (env["pin_memory"], env["persistent_workers"], env["prefetch_factor"]) == (False, True, 2)
    assert data["loader"]["steps_per_epoch"] == 512 // batch
    assert "eval/infer ran on the initial weights (--weights for a trained checkpoint)" in data["notes"]
    assert "trainer/bare" in result.stdout and "a bare PyTorch loop at" in result.stdout
    assert "speed-up" in result.stdout
    # the trainer's own log lines went to the log file, not the report
    assert "global_step: 5" in (tmp_path / "bench" / "benchmark.log").read_text()
    assert "global_step" not in result.stdout


@pytest.mark.slow
def test_benchmark_rejects_a_bad_compile_setting(tmp_path, digits_dir):
    cfg = tiny_config(str(tmp_path / "t.yml"), digits_dir, str(tmp_path / "o"), epochs=1)
    result = run_tool(["benchmark.py", "-c", cfg, "-o", "Global.compile={modes: max-autotune}"])
    assert result.returncode == 2
    assert "unknown key(s) in Global.compile: ['modes']" in result.stderr and "Traceback" not in result.stderr


REC_RECIPE = os.path.join("configs", "rec", "rec_mv3_none_bilstm_ctc.yml")


@pytest.mark.slow
def test_synthetic_measures_the_recipe_on_a_set_at_its_size(tmp_path):
    """--synthetic outside --input_pipeline: the recipe (whose data set is not here) reads a
    synthetic set of --images lines per split, drawn under --output_dir's parent."""
    out = tmp_path / "bench.json"
    images, batch = 24, 8
    check_ok(
        run_tool(
            [
                "benchmark.py",
                "-c",
                REC_RECIPE,
                "--synthetic",
                "--images",
                str(images),
                "--iters",
                "2",
                "--warmup",
                "1",
                "--skip",
                "eval",
                "infer",
                "scaling",
                "trainer",
                "-o",
                f"Train.loader.batch_size_per_card={batch}",
                "Train.loader.num_workers=1",
                "--output_dir",
                str(tmp_path / "bench" / "rec"),
                "--json",
                str(out),
            ],
        )  # fmt: skip
    )
    data = json.loads(out.read_text())
    assert data["loader"]["steps_per_epoch"] == images // batch
    assert data["bare_loop"]["samples"] == 2 * batch
    assert (tmp_path / "bench" / "synthetic" / f"rec_{images}").is_dir()


@pytest.mark.slow
def test_synthetic_refuses_the_scaling_runs(tmp_path):
    result = run_tool(
        ["benchmark.py", "-c", REC_RECIPE, "--synthetic", "--nproc", "2", "--output_dir", str(tmp_path / "b")]
    )
    assert result.returncode == 2
    assert "--synthetic measures one process: add --skip scaling" in result.stderr
    assert "Traceback" not in result.stderr
