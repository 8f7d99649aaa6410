"""Compiled code: the images of a module, the module, and a program ready to save.

The other half of the data model (:mod:`kernelpack.summary` holds the kernel summary): an
:class:`Image` is machine code or PTX for one target, a :class:`Module` the same kernels built
for several targets, and :class:`Compiled` a summary with the modules its launches use — what
``kp.compile`` and ``kp.external`` return and ``kp.save`` stores. Plain frozen dataclasses, no
GPU, no FlatBuffers.
"""

from __future__ import annotations

from dataclasses import field
from typing import Callable, Iterable, Sequence

from ._fields import _set
from ._frozen import frozen_dataclass
from .summary import KernelSummary, _name
from .targets import Arch, parse_arch

__all__ = ["Image", "Module", "Compiled", "IMAGE_KINDS", "ORIGINS"]

IMAGE_KINDS = ("cubin", "ptx", "host")


@frozen_dataclass
class Image:
    """Machine code or PTX for one target. ``data`` is the raw (uncompressed) bytes.

    ``cuda_version`` is the producing toolkit as ``1000*major + 10*minor`` (13050 = 13.5); the
    runtime drops images whose toolkit major is newer than the driver's. ``ptx_isa`` is the
    PTX ``.version`` (major, minor) of PTX images.
    """

    kind: str
    arch: Arch
    data: bytes = field(repr=False)  # can be megabytes: keep reprs of Compiled readable
    toolchain: str = ""
    cuda_version: int = 0
    ptx_isa: tuple[int, int] | None = None

    # (written out, as each class of the data model does: see kernelpack._fields)
    def __init__(self, kind: str, arch: Arch | str, data: bytes | bytearray | memoryview,
                 toolchain: str = "", cuda_version: int = 0,
                 ptx_isa: tuple[int, int] | Sequence[int] | None = None) -> None:
        _set(self, "kind", kind)
        _set(self, "arch", arch)
        _set(self, "data", data)
        _set(self, "toolchain", toolchain)
        _set(self, "cuda_version", cuda_version)
        _set(self, "ptx_isa", ptx_isa)
        self.__post_init__()

    def __post_init__(self) -> None:
        if self.kind not in IMAGE_KINDS:
            raise ValueError(f"image kind must be one of {IMAGE_KINDS} (got {self.kind!r})")
        if isinstance(self.arch, str):
            object.__setattr__(self, "arch", parse_arch(self.arch))
        elif not isinstance(self.arch, Arch):  # an int (80) would fail only when saved or run
            raise TypeError(f"image arch must be a target such as 'sm_90' or an Arch "
                            f"(got {self.arch!r:.80})")
        if not isinstance(self.data, (bytes, bytearray, memoryview)):
            raise TypeError(f"image data must be bytes (got {type(self.data).__name__})")
        object.__setattr__(self, "data", bytes(self.data))
        if isinstance(self.ptx_isa, list):  # [8, 0] saved fine but never equalled the loaded
            object.__setattr__(self, "ptx_isa", tuple(self.ptx_isa))  # image's (8, 0)

    @classmethod
    def _lazy(cls, kind: str, arch: Arch, read: "Callable[[], bytes]", toolchain: str = "",
              cuda_version: int = 0, ptx_isa: tuple[int, int] | None = None,
              digest: str = "") -> "Image":
        """An image whose ``data`` is ``read()`` on first access (the loader's digest-checked
        decompression), so a cache hit does not decompress the images no one runs. Otherwise
        an ordinary Image: equality, hashing, ``dataclasses.replace`` and pickling read it.
        ``digest``, the checked digest of the stored bytes, is kept as ``.digest``: the
        runtime's per-process library cache keys images by it instead of hashing them again."""
        self = object.__new__(cls)
        for name, value in (("kind", kind), ("arch", arch), ("toolchain", toolchain),
                            ("cuda_version", cuda_version), ("ptx_isa", ptx_isa),
                            ("_read", read), ("digest", digest)):
            object.__setattr__(self, name, value)
        return self

    def __getattr__(self, name: str) -> object:
        # Runs only when normal lookup fails, i.e. for ``data`` of a lazy image not read yet.
        if name == "data":
            read = self.__dict__.get("_read")
            if read is not None:
                data = read()
                if not isinstance(data, bytes):
                    raise TypeError(f"image data must be bytes (got {type(data).__name__})")
                object.__setattr__(self, "data", data)
                self.__dict__.pop("_read", None)
                return data
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def __getstate__(self) -> dict[str, object]:
        """Pickle/copy state with the bytes read (a lazy image's reader holds a buffer view)."""
        state = dict(self.__dict__)
        if "_read" in state:
            state["data"] = self.data
            del state["_read"]
        return state

    @property
    def target(self) -> str:
        """``sm_90`` for a cubin, ``compute_80`` for PTX, ``host-sm_90`` for host objects."""
        if self.kind == "ptx":
            return self.arch.compute
        if self.kind == "host":
            return "host-" + self.arch.sm
        return self.arch.sm

    def sort_key(self) -> tuple:
        return (IMAGE_KINDS.index(self.kind), self.arch.major, self.arch.minor, self.arch.suffix)


@frozen_dataclass
class Module:
    """A unit of loadable code: the same kernels built for several targets."""

    name: str
    kernels: tuple[str, ...]
    images: tuple[Image, ...]

    def __init__(self, name: str, kernels: Iterable[str], images: Iterable[Image]) -> None:
        _set(self, "name", name)
        _set(self, "kernels", kernels)
        _set(self, "images", images)
        self.__post_init__()

    def __post_init__(self) -> None:
        _name(self.name, "module name")
        # a bare str would become its letters: kernels="axpy" is ('a', 'p', 'x', 'y')
        if isinstance(self.kernels, (str, bytes)):
            raise TypeError(f"module {self.name!r}: kernels must be a list of entry names "
                            f"(got {self.kernels!r:.80})")
        # Materialized first: the checks below iterate, and a generator would be empty by the
        # time it is stored (kernels silently dropped, images reported as "no image").
        for attr in ("kernels", "images"):
            value = getattr(self, attr)
            if isinstance(value, (bytes, bytearray, memoryview)) or not hasattr(value,
                                                                                 "__iter__"):
                raise TypeError(f"module {self.name!r}: {attr} must be a list "
                                f"(got {type(value).__name__})")
            object.__setattr__(self, attr, tuple(value))
        for kernel in self.kernels:  # (an empty or overlong name is the writer's to refuse)
            if not isinstance(kernel, str):
                raise TypeError(f"module {self.name!r}: kernel entry names must be str "
                                f"(got {kernel!r:.80})")
        for image in self.images:
            if not isinstance(image, Image):
                raise TypeError(f"module {self.name!r}: images must be kp.Image (got "
                                f"{type(image).__name__})")
        object.__setattr__(self, "kernels", tuple(sorted(set(self.kernels))))
        images = tuple(sorted(self.images, key=Image.sort_key))
        object.__setattr__(self, "images", images)
        targets = [(i.kind, i.arch) for i in images]
        if len(set(targets)) != len(targets):
            raise ValueError(f"module {self.name!r} has two images for one target")
        if not images:
            raise ValueError(f"module {self.name!r} has no image")


#: Where a :class:`Compiled` came from (its ``origin``).
ORIGINS = ("compiled", "disk", "remote", "external")


@frozen_dataclass
class Compiled:
    """A program ready to save: its summary and the modules its launches use.

    ``origin`` says where it came from: ``"compiled"``, ``"disk"``, ``"remote"`` (cache hits)
    or ``"external"``. It is provenance, not content: equality and hashing leave it out, so a
    cache hit equals the program compiled afresh and ``load(save([c])).compiled(name) == c``.
    """

    summary: KernelSummary
    modules: tuple[Module, ...]
    origin: str = field(default="compiled", compare=False)

    def __init__(self, summary: KernelSummary, modules: Iterable[Module],
                 origin: str = "compiled") -> None:
        _set(self, "summary", summary)
        _set(self, "modules", modules)
        _set(self, "origin", origin)
        self.__post_init__()

    def __post_init__(self) -> None:
        if not isinstance(self.summary, KernelSummary):
            raise TypeError(f"summary must be a kp.KernelSummary (got "
                            f"{type(self.summary).__name__})")
        # ``.origin`` is what a caller branches on ("was this a cache hit?"): a misspelt one
        # would read as a fifth kind of provenance that nothing ever sets
        if not isinstance(self.origin, str):
            raise TypeError(f"program {self.name!r}: origin must be a str, one of "
                            f"{', '.join(map(repr, ORIGINS))} (got {type(self.origin).__name__})")
        if self.origin not in ORIGINS:
            raise ValueError(f"program {self.name!r}: origin must be one of "
                             f"{', '.join(map(repr, ORIGINS))} (got {self.origin!r:.80})")
        object.__setattr__(self, "modules", tuple(self.modules))
        module: Module | None  # a loop variable, then by_name.get's below
        for module in self.modules:
            if not isinstance(module, Module):
                raise TypeError(f"program {self.name!r}: modules must be kp.Module (got "
                                f"{type(module).__name__})")
        by_name = {m.name: m for m in self.modules}
        for variant in self.summary.variants:
            for launch in variant.launches:
                module = by_name.get(launch.module)
                if module is None:
                    raise ValueError(f"program {self.name!r}: launch of {launch.kernel!r} names "
                                     f"module {launch.module!r}, which is not included")
                if launch.kernel not in module.kernels:
                    raise ValueError(f"program {self.name!r}: module {launch.module!r} has no "
                                     f"kernel {launch.kernel!r} (has {list(module.kernels)})")

    @property
    def name(self) -> str:
        return self.summary.name
