"""Seeded random fusions on a GPU: compile → save → load → launch, against NumPy in float64.

The programs come from tests/lowering/fusion_gen/ (the CPU suite runs a few of them through
the SIMT emulator at small sizes); here more seeds run at GPU sizes (up to ~2M elements, rows
up to 300000 long) through the real runtime, torch tensors in and out. Outputs are
preallocated and poisoned (NaN, or an integer pattern) so an element the kernel forgets to
write fails, and the allocating call (no ``out=``) is checked as well. Tolerances: 1e-5
normwise where float32 rounding is involved, 1e-12 otherwise, integers and bools exactly
(``Case.check``). A failure prints the seed, the generated source and the shapes;
``python -m tests.lowering.fusion_gen SEED`` prints the case again (its sizes are the emulator's:
use ``generate(SEED, "gpu")``).
"""

from __future__ import annotations

import numpy as np
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


generate = _load_generator().generate

SEEDS = list(range(1000, 1160))
_TORCH = {"bool": torch.bool, "int32": torch.int32, "int64": torch.int64,
          "float16": torch.float16, "float32": torch.float32, "float64": torch.float64,
          "complex64": torch.complex64, "complex128": torch.complex128}


@pytest.fixture(scope="module")
def cases():
    """Every seed's case, compiled for sm_80/sm_90/PTX into one artifact and loaded back."""
    made = {seed: generate(seed, "gpu") for seed in SEEDS}
    compiled = [kp.compile(c.fusion, targets=["sm_80", "sm_90", "ptx"]) for c in made.values()]
    pack = kp.load(kp.save(compiled))
    return {seed: (case, pack[case.name]) for seed, case in made.items()}


def _args(inputs: list) -> list:
    # np.array(order="C"), not np.ascontiguousarray: that one turns a 0-d array into shape (1,)
    return [torch.from_numpy(np.array(v, order="C")).cuda() if isinstance(v, np.ndarray) else v
            for v in inputs]


def _poisoned(shape: tuple, dtype: kp.DType):
    out = torch.empty(shape, dtype=_TORCH[dtype.name], device="cuda")
    if dtype.kind in "fc":
        out.fill_(float("nan"))
    elif dtype.kind == "i":
        out.fill_(-123456789)
    else:
        out.fill_(True)
    return out


def _numpy(results) -> list[np.ndarray]:
    if not isinstance(results, tuple):
        results = (results,)
    return [r.cpu().numpy() for r in results]


@pytest.mark.parametrize("seed", SEEDS)
def test_random_fusion_on_gpu_matches_numpy(cases, seed):
    case, program = cases[seed]
    summary = program.summary
    assert [t.dtype for t in summary.outputs] == case.out_dtypes, case.describe()
    for sizes in case.sizes:
        inputs = case.inputs(sizes)
        args = _args(inputs)
        plan = program.plan(*args)
        outs = [_poisoned(plan.allocations[t.name].shape, t.dtype) for t in summary.outputs]
        program(*args, out=outs[0] if len(outs) == 1 else tuple(outs))
        allocated = program(*args)
        torch.cuda.synchronize()
        for what, got in (("out=", _numpy(tuple(outs))), ("allocated", _numpy(allocated))):
            failures, _ = case.check(inputs, got)
            assert not failures, (f"{what} (variant {plan.variant})\n{case.describe(sizes)}\n"
                                  + "\n".join(failures))
