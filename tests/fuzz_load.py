"""Fuzz target for the loader: any input must either load, verify and plan, or raise a
KernelPackError — never another exception, a hang or a huge allocation.

    python tests/fuzz_load.py [--examples N]      # hypothesis-driven (no extra install)
    python tests/fuzz_load.py --atheris [ARGS]    # coverage-guided, if atheris is installed

The hypothesis driver mutates valid artifacts (bit flips, byte overwrites, splices,
truncations, insertions) as well as feeding raw random bytes; atheris starts from the same
seed corpus written to a temporary directory.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "src"))

import kernelpack as kp  # noqa: E402
from kernelpack.errors import KernelPackError  # noqa: E402


def seeds() -> list[bytes]:
    import kp_samples

    out = [kp.save(kp_samples.tiny()), kp.save(kp_samples.axpy()), kp.save(kp_samples.rich())]
    golden = HERE / "golden" / "format-1.0.kpack"
    if golden.exists():
        out.append(golden.read_bytes())
    return out


def fuzz_one(data: bytes) -> None:
    """The target: raises only if the loader misbehaves."""
    try:
        pack = kp.load(data)
        pack.verify()
        for name in pack.programs[:4]:
            program = pack[name]
            shapes = [tuple(3 for _ in p.shape) for p in program.summary.inputs
                      if isinstance(p, kp.Tensor)]
            scalars = [3 for p in program.summary.inputs if isinstance(p, kp.Scalar)]
            try:
                program.planner.plan_shapes(shapes, scalars)
            except TypeError:
                pass  # a float scalar given an int: caller misuse, not a file problem
    except KernelPackError:
        pass


def run_hypothesis(examples: int) -> None:
    from hypothesis import HealthCheck, given, settings, strategies as st

    corpus = seeds()

    @st.composite
    def mutated(draw: st.DrawFn) -> bytes:
        data = bytearray(draw(st.sampled_from(corpus)))
        for _ in range(draw(st.integers(1, 4))):
            kind = draw(st.sampled_from(("flip", "byte", "trunc", "splice", "insert")))
            pos = draw(st.integers(0, max(len(data) - 1, 0)))
            if not data:
                break
            if kind == "flip":
                data[pos] ^= 1 << draw(st.integers(0, 7))
            elif kind == "byte":
                data[pos] = draw(st.sampled_from((0, 1, 0x7F, 0x80, 0xFF)))
            elif kind == "trunc":
                del data[pos:]
            elif kind == "splice":
                other = draw(st.sampled_from(corpus))
                data[pos:pos + 16] = other[pos:pos + 16]
            else:
                data[pos:pos] = draw(st.binary(min_size=1, max_size=8))
        return bytes(data)

    @settings(max_examples=examples, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(st.one_of(mutated(), st.binary(max_size=256)))
    def target(data: bytes) -> None:
        fuzz_one(data)

    target()
    print(f"fuzz_load: {examples} hypothesis examples, no unexpected exception")


def run_atheris(argv: list[str]) -> None:
    import atheris  # type: ignore[import-not-found]

    corpus_dir = Path(tempfile.mkdtemp(prefix="kpfuzz-"))
    for i, seed in enumerate(seeds()):
        (corpus_dir / f"seed{i}.kpack").write_bytes(seed)
    atheris.Setup([sys.argv[0], *argv, str(corpus_dir)], fuzz_one)
    atheris.Fuzz()


def main() -> None:
    parser = argparse.ArgumentParser(description="fuzz kp.load")
    parser.add_argument("--examples", type=int, default=2000)
    parser.add_argument("--atheris", action="store_true", help="use atheris (libFuzzer)")
    args, rest = parser.parse_known_args()
    if args.atheris:
        run_atheris(rest)
    else:
        run_hypothesis(args.examples)


if __name__ == "__main__":
    main()
