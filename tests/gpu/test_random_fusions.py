"""Seeded random fusions on a GPU: compile → save → load → launch, against NumPy in float64.

The programs come from tests/lowering/fusion_gen/ (the CPU suite runs a few of them through
the SIMT emulator at small sizes); here more seeds run at GPU sizes (up to ~2M elements, rows
up to 300000 long) through the real runtime, torch tensors in and out. Outputs are
preallocated and poisoned (NaN, or an integer pattern) so an element the kernel forgets to
write fails, and the allocating call (no ``out=``) is checked as well. Tolerances: 1e-5
normwise where float32 rounding is involved, 1e-12 otherwise, integers and bools exactly
(``Case.check``); the half mode's seeds (float16/bfloat16 arithmetic) at a few units of
half roundoff where the kernel may round differently from the reference, exactly elsewhere.
A failure prints the seed, the generated source and the shapes;
``python -m tests.lowering.fusion_gen SEED`` prints the case again (its sizes are the emulator's:
use ``generate(SEED, "gpu")``).
"""

from __future__ import annotations

import pytest

import kernelpack as kp

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch", reason="the GPU tests launch through torch tensors")
if not torch.cuda.is_available():  # pragma: no cover - depends on the machine
    pytest.skip("no CUDA GPU visible to torch", allow_module_level=True)


def _load_generator():
    """The package tests/lowering/fusion_gen/ by path: no package layout or import mode
    assumed."""
    import importlib.util
    import pathlib
    import sys

    path = pathlib.Path(__file__).resolve().parent.parent / "lowering" / "fusion_gen"
    spec = importlib.util.spec_from_file_location(
        "kp_fusion_gen", path / "__init__.py", submodule_search_locations=[str(path)])
    module = importlib.util.module_from_spec(spec)
    # registered first: its relative imports find their submodules through it (and dataclasses
    # look their module up while being built)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


_gen = _load_generator()
generate = _gen.generate

SEEDS = list(range(1000, 1160))
# the half mode (float16/bfloat16 arithmetic, rounded after every operation: fusion_gen's
# docstring), a seed space of its own
HALF_SEEDS = list(range(5000, 5080))


def _pack(made: dict) -> dict:
    compiled = [kp.compile(c.fusion, targets=["sm_80", "sm_90", "ptx"]) for c in made.values()]
    pack = kp.load(kp.save(compiled))
    return {seed: (case, pack[case.name]) for seed, case in made.items()}


@pytest.fixture(scope="module")
def cases():
    """Every seed's case, compiled for sm_80/sm_90/PTX into one artifact and loaded back."""
    return _pack({seed: generate(seed, "gpu") for seed in SEEDS})


@pytest.fixture(scope="module")
def half_cases():
    """The half mode's seeds, compiled and loaded back as :func:`cases`."""
    return _pack({seed: generate(seed, "gpu", halves=True) for seed in HALF_SEEDS})


def _run_and_check(case, program) -> None:
    """Every size of ``case`` into poisoned ``out=`` buffers and allocating, each checked."""
    assert [t.dtype for t in program.summary.outputs] == case.out_dtypes, case.describe()
    failure = _gen.torch_io.run_and_check(torch, case, program)
    assert failure is None, failure


@pytest.mark.parametrize("seed", SEEDS)
def test_random_fusion_on_gpu_matches_numpy(cases, seed):
    _run_and_check(*cases[seed])


@pytest.mark.parametrize("seed", HALF_SEEDS)
def test_random_half_fusion_on_gpu_matches_numpy(half_cases, seed):
    _run_and_check(*half_cases[seed])
