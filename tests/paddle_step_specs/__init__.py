"""The step-equivalence spec of every model family (tests/paddle_step_harness.py), by name: one
module per family, its docstring the measured errors behind its tolerances."""

from __future__ import annotations

from typing import Dict

from paddle_step_harness import StepSpec

from paddle_step_specs import cascade_rcnn, det, faster_rcnn, ocrnet, ppocrv3, rec, seg, segformer, table

SPECS: Dict[str, StepSpec] = {
    module.SPEC.name: module.SPEC
    for module in (rec, ppocrv3, table, det, faster_rcnn, cascade_rcnn, seg, ocrnet, segformer)
}
