"""Rich tables for the ``kernelpack`` CLI, drawn from the dicts of :mod:`kernelpack.cli_facts`.

Rendering only: every fact shown here is also in ``--json``. Text from the artifact is never
interpreted as rich markup (``float32[cdiv(n, 2)]`` would otherwise lose its brackets, and the
file is untrusted): cells and lines are built as :class:`rich.text.Text`. When stdout is not a
terminal, rich prints plain text (no colour codes) at a fixed width.
"""

from __future__ import annotations

import errno
from typing import Any, TextIO

from rich.console import Console
from rich.table import Table
from rich.text import Text

from .cli_facts import printable_facts

__all__ = ["console", "render_pack", "render_plan", "human_size", "signature_text"]

# rows of ``eval``'s launch table at most (runs of identical launches are one row already);
# ``--json`` has every launch
MAX_PLAN_ROWS = 1000


class _Console(Console):
    """A rich console that lets a closed pipe reach :func:`kernelpack.cli.main`: rich's own
    handler exits with status 1 at once, so ``kernelpack inspect big.kpack | head -1`` failed
    where ``--json | head -1`` (plain print) succeeded."""

    def on_broken_pipe(self) -> None:
        self.quiet = True  # drop what is still buffered: nobody reads it
        raise BrokenPipeError(errno.EPIPE, "the reader of standard output has gone")


def console(file: TextIO | None = None) -> Console:
    """A console for ``file`` (stdout): colours on a terminal, 160 columns of plain text when
    piped (rich's 80-column default would wrap every table)."""
    con = _Console(file=file, highlight=False, soft_wrap=False)
    if not con.is_terminal:
        con = _Console(file=file, highlight=False, soft_wrap=False, width=160, no_color=True)
    return con


def human_size(n: int) -> str:
    if n < 1024:
        return f"{n} B"
    value = float(n)
    for unit in ("KiB", "MiB", "GiB"):
        value /= 1024
        if value < 1024 or unit == "GiB":
            break
    return f"{value:.1f} {unit}"


def _line(con: Console, *parts: str | tuple[str, str]) -> None:
    """Print plain parts and (text, style) pairs; nothing is parsed as markup."""
    con.print(Text.assemble(*parts))


def _table(*columns: str, title: str | None = None, right: tuple[str, ...] = ()) -> Table:
    table = Table(title=title, title_justify="left", show_edge=False)
    for col in columns:
        table.add_column(col, justify="right" if col in right else "left")
    return table


def _row(table: Table, *cells: object) -> None:
    table.add_row(*(Text(str(c)) for c in cells))


def _dim3(values: list[str]) -> str:
    """``(cdiv(n, 256), 1, 1)`` shortened to ``cdiv(n, 256)`` when the rest is 1."""
    trimmed = [str(v) for v in values]
    while len(trimmed) > 1 and trimmed[-1] == "1":
        trimmed.pop()
    return trimmed[0] if len(trimmed) == 1 else "(" + ", ".join(trimmed) + ")"


def _repeat(count: str | None, loop: str | None) -> str:
    """``3x, loop s`` for a constant count; a count that is an expression is bracketed,
    ``(lg)x`` or ``(n + 1)x``, so that ``lg`` repeated does not read as a symbol ``lgx``."""
    if count is None:
        return "-"
    times = f"{count}x" if count.isdigit() else f"({count})x"
    return times + (f", loop {loop}" if loop else "")


def signature_text(sig: dict[str, Any]) -> str:
    if not sig["signed"]:
        return "unsigned"
    if sig.get("intact") is False:
        return (f"signed, key {sig['key_id']}: DOES NOT VERIFY (changed after signing, or "
                f"not signed by that key)")
    # the loader checks a signature only against trusted keys (verify --trusted-key)
    state = "verified" if sig["verified"] else "not checked against a trusted key"
    return f"signed, key {sig['key_id']}: {state}"


def render_pack(con: Console, facts: dict[str, Any]) -> None:
    """Everything ``inspect`` knows, program by program, then module by module."""
    facts = printable_facts(facts)  # the artifact's text never reaches the terminal raw
    _line(con, ("format ", "bold"), facts["format_version"], ("   generator ", "bold"),
          facts["generator"] or "-", ("   signature ", "bold"), signature_text(facts["signature"]))
    _line(con, f"{len(facts['programs'])} program(s), {len(facts['modules'])} module(s)")
    for prog in facts["programs"]:
        _render_program(con, prog)
    for module in facts["modules"]:
        _render_module(con, module)


def _render_program(con: Console, prog: dict[str, Any]) -> None:
    con.print()
    con.rule(Text(f"program {prog['name']}"), align="left")
    params = _table("name", "kind", "role", "dtype", "shape / value", title="parameters")
    for p in prog["params"]:
        if p["kind"] == "tensor":
            shape = p["shape"]
            detail = "(" + ", ".join(shape) + ("," if len(shape) == 1 else "") + ")"
        else:
            detail = p.get("value") or "passed by caller"
        role = p["role"] + (" zero-init" if p.get("zero_init") else "")
        _row(params, p["name"], p["kind"], role, p["dtype"], detail)
    con.print(params)
    _line(con, "symbols: ", ", ".join(prog["symbols"]) or "-")
    for c in prog["constraints"]:
        _line(con, "constraint: ", c["predicate"], f"  ({c['message']})" if c["message"] else "")
    shown: dict[str, int] = {}  # in-place refusals printed -> the variant that printed them
    for i, variant in enumerate(prog["variants"]):
        _line(con, (f"variant {i}", "bold"), ": when ", variant["predicate"] or "always")
        for s in variant["scratch"]:
            _line(con, f"  scratch {s['name']}: {s['dtype']}[{', '.join(s['shape'])}]",
                  " zero-init" if s["zero_init"] else "")
        table = _table("#", "kernel", "module", "grid", "block", "shared mem", "repeat", "args")
        for j, launch in enumerate(variant["launches"]):
            repeat = _repeat(launch["count"], launch["loop"])
            _row(table, j, launch["kernel"], launch["module"], _dim3(launch["grid"]),
                 _dim3(launch["block"]), launch["shared_mem"], repeat,
                 ", ".join(a["text"] for a in launch["args"]))
        con.print(table)
        refused = variant.get("in_place_refused")
        key = repr(refused)
        if refused and key in shown:  # a row program's variants often refuse the same pairs
            _line(con, f"  in place: the same pairs copied as in variant {shown[key]}")
        else:
            shown.setdefault(key, i)
            _render_in_place(con, refused)


# pairs refused in place (the call reads the input from a copy) shown per variant; the
# rest are counted (--json lists every one)
IN_PLACE_LINES = 8


def _render_in_place(con: Console, refused: list[dict[str, str]] | None) -> None:
    """The inputs a call reads from a copy when ``out=`` (or an ``inout`` argument) is the
    very same memory, and why in place would be wrong (runtime/aliasing.py)."""
    if refused is None:
        _line(con, "  in place: not worked out (too many arrays and launches to look at)")
        return
    for r in refused[:IN_PLACE_LINES]:
        _line(con, "  in place: ", (f"{r['output']} over {r['input']}", "bold"),
              f" reads {r['input']} from a copy: {r['why']}")
    if len(refused) > IN_PLACE_LINES:
        _line(con, f"  in place: {len(refused) - IN_PLACE_LINES} more pairs read from a "
                   f"copy (--json lists them)")


def _render_module(con: Console, module: dict[str, Any]) -> None:
    con.print()
    con.rule(Text(f"module {module['name']}"), align="left")
    _line(con, "kernels: ", ", ".join(module["kernels"]))
    table = _table("target", "kind", "codec", "stored", "raw", "ratio", "digest", "toolchain",
                   "cuda", "ptx isa", right=("stored", "raw", "ratio"))
    for img in module["images"]:
        cuda = img["cuda_version"]
        _row(table, img["target"], img["kind"], img["codec"] or "-",
             human_size(img["stored_size"]), human_size(img["raw_size"]),
             f"{img['ratio']:.2f}x" if img["ratio"] else "-", (img["digest"] or "")[:16],
             img["toolchain"] or "-", f"{cuda // 1000}.{cuda % 1000 // 10}" if cuda else "-",
             img["ptx_isa"] or "-")
    con.print(table)
    sel = module.get("selection")
    if sel is None:
        return
    driver = sel.get("driver_version")
    under = (f" (driver CUDA {driver // 1000}.{driver % 1000 // 10})"
             if driver is not None else "")
    if sel["error"]:
        # the reasons, not the error's lines: printable_facts has escaped its newlines
        _line(con, f"on {sel['device']}{under}: ", ("no usable image", "red"))
    else:
        _line(con, f"on {sel['device']}{under}: loads ", (sel["chosen"], "bold"))
    for r in sel["reasons"]:
        _line(con, f"  {r['image']}: {r['reason']}")


def render_plan(con: Console, facts: dict[str, Any]) -> None:
    """A concrete plan: symbols, allocations with sizes, launches with numbers."""
    # runs of identical launches first: up to 2**20 launches need not be made printable
    rows = [(index, printable_facts(launch))
            for index, launch in _launch_runs(facts["launches"])[:MAX_PLAN_ROWS + 1]]
    count = len(facts["launches"])
    facts = printable_facts({k: v for k, v in facts.items() if k != "launches"})
    _line(con, ("program ", "bold"), str(facts["program"]), ("   variant ", "bold"),
          str(facts["variant"]))
    _line(con, "symbols: ", ", ".join(f"{k}={v}" for k, v in facts["symbols"].items()) or "-")
    # a computed scalar is in ``symbols`` already, unless a bound symbol of its name hides it
    hidden = {k: v for k, v in facts.get("computed", {}).items() if facts["symbols"].get(k) != v}
    if hidden:
        _line(con, "computed: ", ", ".join(f"{k}={v}" for k, v in hidden.items()))
    if facts["allocations"]:
        allocs = _table("name", "kind", "dtype", "shape", "bytes", "zero-init",
                        title="allocations", right=("bytes",))
        for a in facts["allocations"]:
            _row(allocs, a["name"], a["kind"], a["dtype"],
                 tuple(a["shape"]),
                 f"{a['nbytes']} ({human_size(a['nbytes'])})", "yes" if a["zero_init"] else "")
        con.print(allocs)
    else:
        _line(con, "allocations: none")
    launches = _table("#", "kernel", "module", "grid", "block", "shared mem", "args",
                      title="launches")
    for index, launch in rows[:MAX_PLAN_ROWS]:
        _row(launches, index, launch["kernel"], launch["module"], tuple(launch["grid"]),
             tuple(launch["block"]), launch["shared_mem"], ", ".join(map(str, launch["args"])))
    con.print(launches)
    if len(rows) > MAX_PLAN_ROWS:
        first = rows[MAX_PLAN_ROWS][0].split("..")[0]
        _line(con, f"... launches {first}..{count - 1} not shown "
                   f"(--json lists every launch)")


def _launch_runs(launches: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    """One row per run of identical consecutive launches, numbered ``3..8``: a launch
    repeated a million times (the format's limit) is one row, not a table that takes
    minutes to lay out."""
    rows: list[tuple[str, dict[str, Any]]] = []
    i = 0
    while i < len(launches):
        j = i + 1
        while j < len(launches) and launches[j] == launches[i]:
            j += 1
        rows.append((str(i) if j == i + 1 else f"{i}..{j - 1}", launches[i]))
        i = j
    return rows
