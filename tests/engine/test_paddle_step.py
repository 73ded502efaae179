"""ppdist's training step is the original's, for every model family with a step-equivalence
fixture (tests/fixtures/paddle_step/, written by the original training code; no Paddle is needed):
the checks of tests/paddle_step_harness.py on each family's spec (tests/paddle_step_specs/, where
the measured errors behind each tolerance are).

The family and each training forward (``run``) are module-scoped and parametrized by name, so
pytest runs a family's tests together and sets each up once."""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Iterator, List, Tuple

import pytest
from paddle_step_harness import (
    CHECKS,
    Family,
    Schedule,
    StepRun,
    StepSpec,
    check_forward,
    check_gradients,
    check_replay,
    check_schedule,
    check_statistics,
    check_teacher_losses,
    family_context,
)
from paddle_step_specs import SPECS


def marks(spec: StepSpec, check: str) -> List[pytest.MarkDecorator]:
    return [pytest.mark.slow] if check in spec.slow else []


def families(check: str) -> List:
    """One parameter (the family's name) per family."""
    assert check in CHECKS
    return [pytest.param(name, id=name, marks=marks(spec, check)) for name, spec in SPECS.items()]


def runs(check: str) -> List:
    """(family, (family, variant)) for every training forward ``check`` runs on."""
    assert check in CHECKS
    return [
        pytest.param(name, (name, variant), id=f"{name}-{variant}", marks=marks(spec, check))
        for name, spec in SPECS.items()
        for variant in spec.variants_of(check)
    ]


def schedules() -> List:
    return [
        pytest.param(name, schedule, id=f"{name}-{schedule.name}", marks=marks(spec, "schedule"))
        for name, spec in SPECS.items()
        for schedule in spec.schedules
    ]


def own_checks() -> List:
    return [
        pytest.param(name, check, id=f"{name}-{check.__name__}", marks=marks(spec, check.__name__))
        for name, spec in SPECS.items()
        for check in spec.checks
    ]


@pytest.fixture(scope="module")
def family(name: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Family]:
    with family_context(SPECS[name], Path(tmp_path_factory.mktemp(f"paddle_step_{name}"))) as opened:
        yield opened


@pytest.fixture(scope="module")
def run(family: Family, case: Tuple[str, str]) -> StepRun:
    """One training forward and backward of the family's variant ``case[1]``."""
    return family.run(case[1])


@pytest.mark.parametrize("name, case", runs("forward"), scope="module")
def test_outputs_and_loss_terms_of_ppdists_forward_equal_the_originals(family: Family, run: StepRun) -> None:
    check_forward(family, run)


@pytest.mark.parametrize("name, case", runs("teacher"), scope="module")
def test_loss_on_the_originals_outputs_equals_the_originals(family: Family, run: StepRun) -> None:
    check_teacher_losses(family, run)


@pytest.mark.parametrize("name, case", runs("gradients"), scope="module")
def test_raw_gradients_equal_the_originals(family: Family, run: StepRun) -> None:
    check_gradients(family, run)


@pytest.mark.parametrize("name, case", runs("statistics"), scope="module")
def test_batch_norm_statistics_after_the_training_forward_equal_the_originals(
    family: Family, run: StepRun
) -> None:
    check_statistics(family, run)


@pytest.mark.parametrize("name", families("replay"), scope="module")
def test_optimizer_replay_of_the_originals_gradients_equals_its_update(family: Family) -> None:
    check_replay(family)


@pytest.mark.parametrize("name, schedule", schedules(), scope="module")
def test_lr_schedule_equals_the_originals(family: Family, schedule: Schedule) -> None:
    check_schedule(family, schedule)


@pytest.mark.parametrize("name, check", own_checks(), scope="module")
def test_family_check(family: Family, check: Callable[[Family], None]) -> None:
    """A family's own check (its spec's ``checks``: the shipped recipe is the original's, ...)."""
    check(family)
