"""Which image of a module runs on a device: pure Python, from the manifest alone.

No CUDA import here, so ``kernelpack inspect FILE --device sm_86`` can explain the choice on a
machine without a GPU. The rules (issue 4 §1, NVIDIA's compatibility guides):

1. Drop images whose producing toolkit major is newer than the driver's CUDA major
   (``cuDriverGetVersion``: 13000 is CUDA 13.0). A newer *minor* of the same major is fine:
   nvJitLink produces SASS toolkit-side (minor-version compatibility).
2. Cubins: an ``a`` cubin (``sm_90a``) runs only on exactly that compute capability; plain and
   family (``f``) cubins run on the same major with a minor at most the device's. Ranking:
   exact ``a`` > exact plain/``f`` > highest lower minor.
3. Otherwise PTX whose ISA the driver supports and whose target the device reaches (plain:
   arch <= device; ``f``: same major, minor <= device; ``a``: exact). The highest target wins.
4. Otherwise :class:`~kernelpack.errors.CompatibilityError` listing the device, the driver and
   every image with the reason it was rejected.

Images are duck-typed: anything with ``kind``, ``arch`` (:class:`~kernelpack.targets.Arch`),
``cuda_version`` and ``ptx_isa`` (the loader's ``ImageInfo`` and :class:`kernelpack.Image`).
"""

from __future__ import annotations

from typing import Any, Sequence

from .._records import FrozenRecord
from ..errors import CompatibilityError
from ..targets import Arch, parse_arch

__all__ = ["PTX_ISA_BY_CUDA", "MIN_DRIVER_VERSION", "Selection", "select_image", "explain",
           "max_ptx_isa",
           "format_cuda_version", "image_label"]

# CUDA toolkit/driver version (major, minor) -> the newest PTX ISA it accepts. From the PTX ISA
# release notes, and for 12.x/13.x cuda-bindings 13.5's
# ``cuda.bindings.utils.get_minimal_required_cuda_ver_from_ptx_ver`` (8.6 -> 12.7, 9.2..9.5 ->
# 13.2..13.5; review 28 found ISA 9.2-9.5 PTX, which this machine's nvJitLink 13.5 writes,
# refused on every driver from 13.2 up). A driver newer than the last row is assumed to accept
# at least that row's ISA (conservative: a newer PTX is rejected with a reason rather than
# failing inside the driver).
PTX_ISA_BY_CUDA: tuple[tuple[tuple[int, int], tuple[int, int]], ...] = (
    ((10, 0), (6, 3)), ((10, 1), (6, 4)), ((10, 2), (6, 5)),
    ((11, 0), (7, 0)), ((11, 1), (7, 1)), ((11, 2), (7, 2)), ((11, 3), (7, 3)),
    ((11, 4), (7, 4)), ((11, 5), (7, 5)), ((11, 6), (7, 6)), ((11, 7), (7, 7)),
    ((11, 8), (7, 8)),
    ((12, 0), (8, 0)), ((12, 1), (8, 1)), ((12, 2), (8, 2)), ((12, 3), (8, 3)),
    ((12, 4), (8, 4)), ((12, 5), (8, 5)), ((12, 6), (8, 5)), ((12, 7), (8, 6)),
    ((12, 8), (8, 7)), ((12, 9), (8, 8)),
    ((13, 0), (9, 0)), ((13, 1), (9, 1)), ((13, 2), (9, 2)), ((13, 3), (9, 3)),
    ((13, 4), (9, 4)), ((13, 5), (9, 5)),
)


# The oldest driver the runtime can load anything with: cuLibraryLoadData is CUDA 12.0's
# (cuda-loading.md (a)); an 11.x driver lacks the symbol, so every image is rejected there.
MIN_DRIVER_VERSION = 12000


def format_cuda_version(version: int) -> str:
    """``13000`` -> ``"13.0"`` (the ``cuDriverGetVersion`` encoding)."""
    return f"{version // 1000}.{(version % 1000) // 10}"


def max_ptx_isa(driver_version: int) -> tuple[int, int] | None:
    """The newest PTX ISA a driver of ``driver_version`` (e.g. 12040) can JIT; None when the
    driver predates every row of the table."""
    have = (driver_version // 1000, (driver_version % 1000) // 10)
    best: tuple[int, int] | None = None
    for cuda, isa in PTX_ISA_BY_CUDA:
        if cuda <= have:
            best = isa
    return best


def image_label(image: Any) -> str:
    """``cubin sm_90`` / ``ptx compute_80 (ISA 8.0)`` / ``host sm_90``: how messages name it."""
    arch: Arch = image.arch
    if image.kind == "ptx":
        isa = getattr(image, "ptx_isa", None)
        return f"ptx {arch.compute}" + (f" (ISA {isa[0]}.{isa[1]})" if isa else "")
    return f"{image.kind} {arch.sm}"


class Selection(FrozenRecord):
    """The chosen image and, for every image of the module, why it was or was not chosen.
    Immutable (a :class:`~kernelpack._records.FrozenRecord`)."""

    __slots__ = ("chosen", "device", "driver_version", "reasons")
    chosen: Any  # an ImageInfo or a kp.Image (what select_image was given)
    device: Arch
    driver_version: int | None
    reasons: list[tuple[Any, str]]

    def __init__(self, chosen: Any, device: Arch, driver_version: int | None,
                 reasons: list[tuple[Any, str]] | None = None) -> None:
        self._set(chosen=chosen, device=device, driver_version=driver_version,
                  reasons=[] if reasons is None else reasons)

    __hash__ = None  # type: ignore[assignment]  # ``reasons`` is a list: unhashable anyway

    @property
    def needs_compile(self) -> bool:
        """True when the choice is PTX (compiled locally with nvJitLink before loading)."""
        return self.chosen.kind == "ptx"

    def lines(self) -> list[str]:
        """Readable lines: one per image, the chosen one marked."""
        out = [f"device {self.device.major}.{self.device.minor}, driver "
               + (f"CUDA {format_cuda_version(self.driver_version)}"
                  if self.driver_version is not None else "not given")]
        for image, reason in self.reasons:
            mark = "*" if image is self.chosen else " "
            out.append(f" {mark} {image_label(image)}: {reason}")
        return out


def _device_arch(device: Arch | str) -> Arch:
    if isinstance(device, Arch):
        return device
    if isinstance(device, str):
        return parse_arch(device)
    raise TypeError(f"device must be an Arch or a string such as 'sm_86' (got {device!r})")


def _rank(image: Any, dev: Arch, driver_version: int | None) -> tuple[tuple | None, str]:
    """(rank, reason): rank None means rejected, a higher rank is preferred."""
    kind, arch = image.kind, image.arch
    cuda = int(getattr(image, "cuda_version", 0) or 0)
    if kind == "host":
        return None, "host object code, not GPU code"
    if kind not in ("cubin", "ptx"):
        return None, f"unknown image kind {kind!r}"
    if driver_version is not None and driver_version < MIN_DRIVER_VERSION:
        return None, (f"the driver's CUDA {format_cuda_version(driver_version)} predates "
                      f"cuLibraryLoadData (CUDA 12.0), which the runtime loads images with")
    # A cubin needs a driver of its toolkit's major. PTX is compiled here, by this machine's
    # nvJitLink: what it needs of the driver is its ISA (below), whatever toolkit wrote it
    # (kp.compile records nvJitLink's version on LLVM's ISA 8.x PTX, which a CUDA 12 driver
    # takes); the toolkit's major gates PTX only when the ISA is not recorded.
    gated = kind == "cubin" or getattr(image, "ptx_isa", None) is None
    if gated and cuda and driver_version is not None and cuda // 1000 > driver_version // 1000:
        return None, (f"built by CUDA {format_cuda_version(cuda)}, newer major than the "
                      f"driver's CUDA {format_cuda_version(driver_version)}")
    here = f"device is {dev.major}.{dev.minor}"
    if kind == "cubin":
        if arch.major != dev.major:
            return None, f"a cubin runs only on {arch.major}.x devices ({here})"
        if arch.suffix == "a":
            if arch.minor != dev.minor:
                return None, (f"an arch-specific cubin runs only on exactly "
                              f"{arch.major}.{arch.minor} ({here})")
            return (3, 2, 0), "exact arch-specific cubin"
        if arch.minor > dev.minor:
            return None, f"cubin needs compute capability >= {arch.major}.{arch.minor} ({here})"
        if arch.minor == dev.minor:
            return (3, 1, 0 if arch.suffix else 1), "exact cubin"
        return (2, arch.minor, 0 if arch.suffix else 1), "compatible cubin (same major, lower minor)"
    # PTX
    if arch.suffix == "a" and (arch.major, arch.minor) != (dev.major, dev.minor):
        return None, f"arch-specific PTX runs only on exactly {arch.major}.{arch.minor} ({here})"
    if arch.suffix == "f" and (arch.major != dev.major or arch.minor > dev.minor):
        return None, (f"family PTX runs only on {arch.major}.x with minor >= {arch.minor} "
                      f"({here})")
    if (arch.major, arch.minor) > (dev.major, dev.minor):
        return None, f"PTX for {arch.major}.{arch.minor} is newer than the device ({here})"
    isa = getattr(image, "ptx_isa", None)
    if driver_version is not None and isa is not None:
        top = max_ptx_isa(driver_version)
        if top is None or tuple(isa) > top:
            limit = f"ISA {top[0]}.{top[1]}" if top else "no PTX ISA known"
            return None, (f"PTX ISA {isa[0]}.{isa[1]} is newer than the driver accepts "
                          f"(CUDA {format_cuda_version(driver_version)}: {limit})")
    # (which compiler runs is the loading machine's to know: the driver JITs it where that
    # machine's nvJitLink is missing or newer than its driver; README, review 74)
    return (1, arch.major, arch.minor), "PTX, compiled for the device at load (nvJitLink/JIT)"


def select_image(images: Sequence[Any], device: Arch | str, driver_version: int | None,
                 what: str = "module") -> Selection:
    """Choose the image to load for ``device`` under a driver of ``driver_version``.

    Parameters
    ----------
    images:
        The module's images (loader ``ImageInfo`` or :class:`kernelpack.Image`).
    device:
        The device's compute capability (``Arch`` or ``"sm_86"``; a suffix is ignored).
    driver_version:
        ``cuDriverGetVersion`` (13000 = CUDA 13.0), or None to skip the driver gates (used by
        ``inspect`` without a GPU).
    what:
        How messages name the module (``"module 'softmax'"``).

    Returns
    -------
    A :class:`Selection` whose ``reasons`` cover every image.

    Raises
    ------
    CompatibilityError
        No image is usable; the message lists the device, the driver and every image with
        the reason it was rejected.
    """
    dev = _device_arch(device)
    dev = Arch(dev.major, dev.minor)
    ranked: list[tuple[tuple | None, str, Any]] = [(*_rank(img, dev, driver_version), img)
                                                    for img in images]
    usable = [(rank, img) for rank, _, img in ranked if rank is not None]
    if not usable:
        driver = (f"CUDA {format_cuda_version(driver_version)} ({driver_version})"
                  if driver_version is not None else "not given")
        lines = [f"  {image_label(img)}: {reason}" for _, reason, img in ranked] or \
                ["  (no images)"]
        raise CompatibilityError(
            f"no image of {what} runs on this device: device sm_{dev.major}{dev.minor} "
            f"(compute capability {dev.major}.{dev.minor}), driver {driver}; images:\n"
            + "\n".join(lines))
    best_rank, chosen = max(usable, key=lambda item: item[0])
    reasons: list[tuple[Any, str]] = []
    for rank, reason, img in ranked:
        if img is chosen:
            reasons.append((img, "chosen: " + reason))
        elif rank is None:
            reasons.append((img, "rejected: " + reason))
        else:
            reasons.append((img, f"usable ({reason}), but {image_label(chosen)} ranks higher"))
    return Selection(chosen, dev, driver_version, reasons)


def explain(images: Sequence[Any], device: Arch | str,
            driver_version: int | None = None, what: str = "module") -> list[str]:
    """Readable lines explaining which image ``device`` would load, or why none can: for the
    CLI (``kernelpack inspect FILE --device sm_86``). Never raises CompatibilityError."""
    try:
        return select_image(images, device, driver_version, what).lines()
    except CompatibilityError as exc:
        return str(exc).splitlines()
