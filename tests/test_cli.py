"""Clean error messages from the tools, also for errors raised inside DataLoader workers."""

from ppdist_testing import check_ok, run_tool
from torch.utils.data import DataLoader

from ppdist.cli import error_message
from ppdist.errors import DataError


def _failing_collate(samples):
    raise DataError("samples of one batch have different sizes: use batch_size_per_card: 1")


def test_worker_error_keeps_only_the_original_message():
    try:
        list(DataLoader([1, 2], batch_size=2, collate_fn=_failing_collate, num_workers=1))
    except DataError as exc:
        assert "Traceback" in str(exc)  # what torch re-raises
        assert error_message(exc) == "samples of one batch have different sizes: use batch_size_per_card: 1"
    else:  # pragma: no cover
        raise AssertionError("the loader did not fail")


def test_plain_errors_are_unchanged():
    assert error_message(DataError("missing file x.png")) == "missing file x.png"


def test_infer_refuses_a_batch_size_below_one_and_tools_explain_their_options(tmp_path):
    refused = run_tool(["infer.py", "--input", str(tmp_path), "--batch_size", "-5"])
    assert refused.returncode == 2
    assert "--batch_size: expected a positive integer, got -5" in refused.stderr
    assert "Traceback" not in refused.stderr
    infer_help = check_ok(run_tool(["infer.py", "-h"])).stdout
    assert "images per forward pass" in " ".join(infer_help.split())
    export_help = check_ok(run_tool(["export_model.py", "-h"])).stdout
    assert "model.onnx, model.pt (TorchScript) or both" in " ".join(export_help.split())
