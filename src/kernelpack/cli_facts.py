"""The facts the ``kernelpack`` CLI shows, as plain JSON-able dicts.

``inspect --json`` prints these dicts; the rich tables render the same dicts; ``diff`` compares
them. Keeping one source for all three means the text, the JSON and the diff can never disagree.
Expressions appear in their readable form (``cdiv(n, 256)``); nothing here touches a GPU.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping, cast

from .expr import Expr
from .expr_text import whole_text
from .summary import Arg, KernelSummary, Launch, Scalar, Tensor

__all__ = ["ExprText", "summary_facts", "in_place_facts", "IN_PLACE_WORK", "unprinted_changes",
           "launch_facts", "arg_text", "image_facts", "module_facts", "pack_facts", "plan_facts",
           "selection_facts", "diff_facts", "ratio", "printable", "printable_facts"]


def printable(text: str) -> str:
    """``text`` safe for a terminal: control characters (ESC sequences, carriage returns,
    backspaces) and invisible format characters (bidirectional overrides) from the untrusted
    artifact are shown escaped, as ``\\x1b`` or ``\\u202e``, instead of acting on the
    terminal. JSON output needs no such care: ``json.dumps`` escapes them itself."""
    if text.isprintable():
        return text
    import unicodedata

    out = []
    for ch in text:
        if ch.isprintable() or ch == " " or unicodedata.category(ch) not in ("Cc", "Cf"):
            out.append(ch)
        else:
            out.append(ascii(ch)[1:-1])  # "\x1b", "\u202e"
    return "".join(out)


def printable_facts(value: Any) -> Any:
    """:func:`printable` applied to every string in a facts structure."""
    if isinstance(value, str):
        return printable(value)
    if isinstance(value, dict):
        return {k: printable_facts(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(printable_facts(v) for v in value)
    return value


# How much ``in_place_facts`` works out for one artifact, at most (about 2 s on a slow box):
# each variant costs its launches x its written and read tensors, plus its pairs (what
# runtime/in_place.py's refused_pairs loops over), and a hostile file may hold thousands of
# programs of 64 variants of 4096 launches over 128 outputs and 128 inputs
IN_PLACE_WORK = 10_000_000


class ExprText:
    """Prints the expressions of one ``inspect``/``diff``: each whole up to
    :data:`WHOLE_NODES` nodes (a machine reading ``--json``, or ``diff``, must see all of it;
    ``str()`` stops after a message's few hundred), within a budget of :data:`TOTAL_NODES`
    for the whole artifact, after which ``str()``'s short form is used: a hostile file's
    shared nodes can make each of thousands of fields print as a huge tree."""

    WHOLE_NODES = 1 << 16
    TOTAL_NODES = 1 << 20

    def __init__(self) -> None:
        self.left = self.TOTAL_NODES
        self.in_place_left = IN_PLACE_WORK  # in_place_facts' budget, shared the same way

    def __call__(self, expr: Expr) -> str:
        if self.left <= 0:
            return str(expr)
        text, visited = whole_text(expr, min(self.WHOLE_NODES, self.left))
        self.left -= visited
        return str(expr) if text is None else text

    def optional(self, expr: Expr | None) -> str | None:
        return None if expr is None else self(expr)


def arg_text(arg: Arg, text: ExprText | None = None) -> str:
    """``x`` for a buffer or scalar, ``uint32(1 << s)`` for a computed value."""
    if arg.kind == "value":
        # (a "value" argument holds its expression)
        return f"{arg.dtype}({(text or ExprText())(cast(Expr, arg.value))})"
    return arg.name


def launch_facts(launch: Launch, text: ExprText | None = None) -> dict[str, Any]:
    x = text or ExprText()
    return {
        "kernel": launch.kernel,
        "module": launch.module,
        "grid": [x(d) for d in launch.grid],
        "block": [x(d) for d in launch.block],
        "shared_mem": x(launch.shared_mem),
        "count": x.optional(launch.count),
        "loop": launch.loop or None,
        "args": [{"kind": a.kind, "text": arg_text(a, x)} for a in launch.args],
        "reads_elsewhere": list(launch.reads_elsewhere),
        "stores_after_loads": launch.stores_after_loads,
    }


def summary_facts(summary: KernelSummary, text: ExprText | None = None) -> dict[str, Any]:
    """Parameters, constraints and variants of one program, expressions printed (whole, as
    :class:`ExprText` says; ``text`` shares one budget across an artifact's programs)."""
    x = text or ExprText()
    params: list[dict[str, Any]] = []
    for p in summary.params:
        if isinstance(p, Tensor):
            params.append({"name": p.name, "kind": "tensor", "role": p.role,
                           "dtype": p.dtype.name, "shape": [x(d) for d in p.shape],
                           "zero_init": p.zero_init})
        else:
            assert isinstance(p, Scalar)
            params.append({"name": p.name, "kind": "scalar",
                           "role": "computed" if p.value is not None else "in",
                           "dtype": p.dtype.name, "value": x.optional(p.value)})
    variants = []
    for i, v in enumerate(summary.variants):
        variants.append({
            "predicate": x.optional(v.predicate),
            "scratch": [{"name": s.name, "dtype": s.dtype.name,
                         "shape": [x(d) for d in s.shape], "zero_init": s.zero_init}
                        for s in v.scratch],
            "launches": [launch_facts(launch, x) for launch in v.launches],
            "in_place_refused": in_place_facts(summary, i, x),
        })
    return {
        "name": summary.name,
        "params": params,
        "symbols": summary.bound_symbols(),
        "constraints": [{"predicate": x(c.predicate), "message": c.message}
                        for c in summary.constraints],
        "outputs": [p.name for p in summary.outputs],
        "variants": variants,
    }


def in_place_facts(summary: KernelSummary, variant: int, text: ExprText | None = None
                   ) -> list[dict[str, str]] | None:
    """The output (or ``inout``) and input pairs of ``variant`` that may not run in place: a
    call passing one as the very same memory reads the input from a copy (runtime/
    aliasing.py), each with why (the runtime's rule: runtime/in_place.py), in name order;
    None once the work (see :data:`IN_PLACE_WORK`) would pass what is left of it in ``text``
    (one budget for a whole artifact)."""
    from .runtime.in_place import refused_in_variant

    budget = text or ExprText()
    tensors = [p for p in summary.params if isinstance(p, Tensor)]
    written = sum(1 for t in tensors if t.role != "in")
    read = sum(1 for t in tensors if t.role != "out")
    work = len(summary.variants[variant].launches) * (written + read) + written * read
    if work > budget.in_place_left:
        return None
    budget.in_place_left -= work
    refused = refused_in_variant(summary, variant)
    return [{"output": w, "input": r, "why": why} for (w, r), why in sorted(refused.items())]


def ratio(stored: int, raw: int) -> float | None:
    """raw / stored: 3.0 means the stored image is a third of its raw size."""
    return round(raw / stored, 2) if stored else None


def _isa(value: Any) -> str | None:
    if not value:
        return None
    return f"{value[0]}.{value[1]}"


def image_facts(image: Any) -> dict[str, Any]:
    """One image of a loaded artifact (``ImageInfo``, duck-typed)."""
    stored = int(getattr(image, "stored_size", 0) or 0)
    raw = int(getattr(image, "raw_size", 0) or 0)
    arch = image.arch
    target = getattr(image, "target", None) or (arch.compute if image.kind == "ptx" else arch.sm)
    return {
        "target": target,
        "kind": image.kind,
        "arch": arch.sm if hasattr(arch, "sm") else str(arch),
        "codec": getattr(image, "codec", None),
        "stored_size": stored,
        "raw_size": raw,
        "ratio": ratio(stored, raw),
        "digest": getattr(image, "digest", None),
        "raw_digest": getattr(image, "raw_digest", None),
        "toolchain": getattr(image, "toolchain", "") or "",
        "cuda_version": int(getattr(image, "cuda_version", 0) or 0),
        "ptx_isa": _isa(getattr(image, "ptx_isa", None)),
    }


def selection_facts(images: list[Any], device: str, what: str,
                    driver_version: int | None = None) -> dict[str, Any]:
    """Which image the runtime would load on ``device`` under a driver of ``driver_version``
    (None: no driver gate), and why."""
    from .errors import CompatibilityError
    from .runtime.selection import _rank, image_label, select_image
    from .targets import Arch, parse_arch

    try:
        sel = select_image(images, device, driver_version, what)
    except CompatibilityError as exc:
        # Every image was rejected: give the reasons as data too, so that --json readers and
        # the text renderer need not parse them out of the message.
        dev = parse_arch(device)
        dev = Arch(dev.major, dev.minor)  # the device's suffix plays no part (select_image)
        return {"device": device, "driver_version": driver_version, "chosen": None,
                "error": str(exc),
                "reasons": [{"image": image_label(img),
                             "reason": "rejected: " + _rank(img, dev, driver_version)[1]}
                            for img in images]}
    return {
        "device": device,
        "driver_version": driver_version,
        "chosen": image_label(sel.chosen),
        "error": None,
        "reasons": [{"image": image_label(img), "reason": reason} for img, reason in sel.reasons],
    }


def module_facts(module: Any, device: str | None = None,
                 driver_version: int | None = None) -> dict[str, Any]:
    images = list(module.images)
    facts: dict[str, Any] = {
        "name": module.name,
        "kernels": list(module.kernels),
        "images": [image_facts(i) for i in images],
    }
    if device is not None:
        facts["selection"] = selection_facts(images, device, f"module {module.name!r}",
                                             driver_version)
    return facts


def _signature_facts(pack: Any) -> dict[str, Any]:
    """``signed``, ``key_id``, ``verified`` (against a trusted key) and ``intact``: whether
    the signature verifies under the key it names (None when unsigned). Without ``intact``
    anyone could write the team's public key beside a forged signature and be shown as
    signed by the team (review 29); the check costs about 0.1 ms."""
    sig = getattr(pack, "signature", None)
    if sig is None:
        return {"signed": False, "key_id": None, "verified": None, "intact": None}
    intact = True
    check = getattr(pack, "check_signature_intact", None)
    if check is not None:
        from .errors import SignatureError

        try:
            check()
        except SignatureError:
            intact = False
    return {"signed": True, "key_id": getattr(sig, "key_id", None),
            "verified": getattr(sig, "verified", None), "intact": intact}


def _version(value: Any) -> str:
    if isinstance(value, tuple):
        return ".".join(str(v) for v in value)
    return str(value)


def pack_facts(pack: Any, device: str | None = None,
               driver_version: int | None = None) -> dict[str, Any]:
    """Everything ``inspect`` shows about a loaded artifact."""
    modules = pack.modules
    items: Iterable[Any] = modules.values() if isinstance(modules, Mapping) else modules
    text = ExprText()
    return {
        "format_version": _version(pack.format_version),
        "generator": getattr(pack, "generator", ""),
        "signature": _signature_facts(pack),
        "programs": [summary_facts(pack[name].summary, text) for name in pack.programs],
        "modules": [module_facts(m, device, driver_version)
                    for m in sorted(items, key=lambda m: m.name)],
    }


def plan_facts(plan: Any) -> dict[str, Any]:
    """A concrete plan (``Program.plan``): every value is a plain int or string."""
    allocations = plan.allocations
    allocs = allocations.values() if isinstance(allocations, Mapping) else allocations
    return {
        "program": getattr(plan.program, "name", plan.program),
        "variant": plan.variant if isinstance(plan.variant, (int, str, type(None)))
        else str(plan.variant),
        "symbols": {k: int(v) for k, v in dict(plan.symbols).items()},
        # what the runtime passes for each computed scalar: in ``symbols`` a bound symbol of
        # the same name wins, so the value a kernel gets for it is only here
        "computed": {k: int(v) for k, v in dict(getattr(plan, "computed", {})).items()},
        "allocations": [{
            "name": a.name, "kind": getattr(a, "kind", ""), "dtype": str(a.dtype),
            "shape": [int(d) for d in a.shape], "nbytes": int(a.nbytes),
            "zero_init": bool(getattr(a, "zero_init", False)),
        } for a in allocs],
        "launches": [{
            "kernel": launch.kernel, "module": launch.module,
            "grid": [int(d) for d in launch.grid], "block": [int(d) for d in launch.block],
            "shared_mem": int(launch.shared_mem),
            "args": [_plain(a) for a in getattr(launch, "args", ())],
        } for launch in plan.launches],
    }


def _plain(value: Any) -> Any:
    """A planned argument as text: ``x`` for a buffer or scalar, ``uint32(4096)`` for a value
    (planner tuples ``("buffer", name)``, ``("scalar", name)``, ``("value", int, dtype)``)."""
    if isinstance(value, tuple) and len(value) == 3 and value[0] == "value":
        return f"{value[2]}({value[1]})"
    if isinstance(value, tuple) and len(value) == 2:
        return str(value[1])
    return str(value)


def diff_facts(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    """Readable lines for what differs between two ``pack_facts``; empty when the programs,
    modules and images (by raw digest, and the CUDA version and PTX ISA that a driver checks)
    are the same."""
    lines: list[str] = []
    progs_a = {p["name"]: p for p in a["programs"]}
    progs_b = {p["name"]: p for p in b["programs"]}
    for name in sorted(progs_a.keys() - progs_b.keys()):
        lines.append(f"- program {name}")
    for name in sorted(progs_b.keys() - progs_a.keys()):
        lines.append(f"+ program {name}")
    for name in sorted(progs_a.keys() & progs_b.keys()):
        changes = list(_dict_changes(progs_a[name], progs_b[name], ""))
        if changes:
            lines.append(f"~ program {name}")
            lines.extend(f"    {c}" for c in changes)
    mods_a = {m["name"]: m for m in a["modules"]}
    mods_b = {m["name"]: m for m in b["modules"]}
    for name in sorted(mods_a.keys() - mods_b.keys()):
        lines.append(f"- module {name}")
    for name in sorted(mods_b.keys() - mods_a.keys()):
        lines.append(f"+ module {name}")
    for name in sorted(mods_a.keys() & mods_b.keys()):
        changes = _module_changes(mods_a[name], mods_b[name])
        if changes:
            lines.append(f"~ module {name}")
            lines.extend(f"    {c}" for c in changes)
    return lines


def unprinted_changes(a: Any, b: Any, lines: list[str]) -> list[str]:
    """Lines for the programs of packs ``a`` and ``b`` whose summaries differ although their
    facts print alike (:func:`diff_facts` found nothing): an expression too long to print
    whole (:class:`ExprText`) that differs only past its printed part. ``diff`` must never
    call such programs identical."""
    shown = {line[len("~ program "):] for line in lines if line.startswith("~ program ")}
    out: list[str] = []
    for name in sorted(set(a.programs) & set(b.programs)):
        if name not in shown and a[name].summary != b[name].summary:
            out += [f"~ program {name}",
                    "    expressions differ past their printed part (too long to print whole)"]
    return out


def _module_changes(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    out: list[str] = []
    if a["kernels"] != b["kernels"]:
        out.append(f"kernels: {a['kernels']} -> {b['kernels']}")
    imgs_a = {i["target"]: i for i in a["images"]}
    imgs_b = {i["target"]: i for i in b["images"]}
    for t in sorted(imgs_a.keys() - imgs_b.keys()):
        out.append(f"- image {t}")
    for t in sorted(imgs_b.keys() - imgs_a.keys()):
        out.append(f"+ image {t}")
    for t in sorted(imgs_a.keys() & imgs_b.keys()):
        ia, ib = imgs_a[t], imgs_b[t]
        if ia["raw_digest"] != ib["raw_digest"]:
            # a field that did not change is not shown as "X -> X" (it read as a change)
            size = (f"{ia['raw_size']} bytes" if ia["raw_size"] == ib["raw_size"] else
                    f"{ia['raw_size']} -> {ib['raw_size']} bytes")
            tool = ("" if ia["toolchain"] == ib["toolchain"] else
                    f", toolchain {ia['toolchain']!r} -> {ib['toolchain']!r}")
            out.append(f"~ image {t}: raw digest {str(ia['raw_digest'])[:16]} -> "
                       f"{str(ib['raw_digest'])[:16]}, {size}{tool}")
        else:  # same bytes, but these decide whether a driver accepts the image
            for key in ("cuda_version", "ptx_isa"):
                if ia[key] != ib[key]:
                    out.append(f"~ image {t}: {key} {ia[key]} -> {ib[key]}")
    return out


def _dict_changes(a: Any, b: Any, path: str) -> Iterable[str]:
    """Leaf-level differences between two JSON-like values, as ``path: old -> new``."""
    if isinstance(a, dict) and isinstance(b, dict):
        for key in list(a) + [k for k in b if k not in a]:
            sub = f"{path}.{key}" if path else str(key)
            if key not in a:
                yield f"{sub}: (absent) -> {_short(b[key])}"
            elif key not in b:
                yield f"{sub}: {_short(a[key])} -> (absent)"
            else:
                yield from _dict_changes(a[key], b[key], sub)
    elif isinstance(a, list) and isinstance(b, list) and (
            len(a) == len(b) or any(isinstance(v, dict) for v in a + b)):
        # lists of records (variants, launches, params) that grew or shrank: compared item by
        # item, the extra ones named; not the whole of both lists printed on one line
        for i, (x, y) in enumerate(zip(a, b)):
            yield from _dict_changes(x, y, f"{path}[{i}]")
        for i in range(len(b), len(a)):
            yield f"{path}[{i}]: {_short(a[i])} -> (absent)"
        for i in range(len(a), len(b)):
            yield f"{path}[{i}]: (absent) -> {_short(b[i])}"
    elif a != b:
        yield f"{path}: {_short(a)} -> {_short(b)}"


def _short(value: Any) -> str:
    """A record in a few words: ``<x>`` for a parameter, ``<axpy>`` for a launch, ``<variant
    when m <= 1024: rowsum>``, ``<constraint n >= 1>``, ``<in place out0 over x>``."""
    if isinstance(value, dict) and ("name" in value or "kernel" in value):
        return f"<{value.get('name') or value.get('kernel')}>"
    if isinstance(value, dict) and "launches" in value:
        kernels = ", ".join(str(launch.get("kernel")) for launch in value["launches"])
        return f"<variant when {value.get('predicate') or 'always'}: {kernels}>"
    if isinstance(value, dict) and "predicate" in value:
        return f"<constraint {value['predicate']}>"
    if isinstance(value, dict) and "text" in value:
        return f"<{value.get('kind')} {value['text']}>"
    if isinstance(value, dict) and "output" in value and "input" in value:
        return f"<in place {value['output']} over {value['input']}>"
    if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
        return "[" + ", ".join(_short(v) for v in value) + "]"
    return str(value) if isinstance(value, str) else repr(value)
