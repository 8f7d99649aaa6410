"""The stored form of a program's expressions: one shared postfix program, validated once,
evaluated with checked int64 arithmetic.

Encoding (see docs/FORMAT.md, "Expression programs"): ``ops`` is a byte string of opcodes and
``imms`` the int64 immediates, consumed in order by the opcodes that take one (CONST, SYM,
LOAD). The program is a sequence of *roots*; each root is postfix code ending in END, which pops
the single value on the stack into the root table. ``LOAD k`` pushes root ``k`` (``k`` below the
current root), which is how common parts are computed once. Summary fields refer to roots by
index.

Validation (at load, before any evaluation) checks every opcode, every immediate count, every
SYM and LOAD index, stack underflow, the stack depth limit, and that the code ends with END.
Evaluation builds closures from the validated code — data, never Python source — and computes a
root only when something needs it, so ``select`` and unused variants never raise spuriously.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Sequence, cast

from ._records import FrozenRecord
from .errors import ExpressionError, FormatError
from .expr import (_CONST_CACHE, INT64_MAX, INT64_MIN, OPERATORS, Expr, ExprEvalError,
                   apply_op, const, iter_nodes, sym)
from .limits import (MAX_EXPR_DEPTH, MAX_EXPR_OPS, MAX_EXPR_ROOTS, MAX_EXPR_STACK, MAX_SYMBOLS,
                     shown_int)

__all__ = ["OPCODES", "EncodedExprs", "ExprEncoder", "ExprProgram"]

# Opcode numbers are part of the file format: never renumber, only append.
OP_END, OP_CONST, OP_SYM, OP_LOAD = 0, 1, 2, 3
OPCODES: dict[str, int] = {
    "add": 10, "sub": 11, "mul": 12, "floordiv": 13, "ceildiv": 14, "mod": 15, "min": 16,
    "max": 17, "shl": 18, "shr": 19, "eq": 20, "ne": 21, "lt": 22, "le": 23, "gt": 24, "ge": 25,
    "and": 26, "or": 27, "not": 28, "neg": 29, "select": 30,
}
_OPNAME = {code: name for name, code in OPCODES.items()}
_IMM_OPS = (OP_CONST, OP_SYM, OP_LOAD)


class EncodedExprs(FrozenRecord):
    """The three stored vectors of an expression program. Immutable, compared and hashed by
    its fields (a :class:`~kernelpack._records.FrozenRecord`, not a frozen dataclass: making
    the dataclass cost about a millisecond of a process's first ``kp.load``)."""

    __slots__ = ("symbols", "ops", "imms")
    symbols: tuple[str, ...]
    ops: bytes
    imms: tuple[int, ...]

    def __init__(self, symbols: tuple[str, ...], ops: bytes, imms: tuple[int, ...]) -> None:
        self._set(symbols=symbols, ops=ops, imms=imms)

    def __reduce__(self) -> tuple:
        return (EncodedExprs, self._fields())  # pickle/copy: __setattr__ refuses assignment


class ExprEncoder:
    """Collects the expressions of one program and encodes them into one shared program.

    Call :meth:`add` for every expression a summary field needs (it returns the root index to
    store), then :meth:`finish`. Subexpressions used more than once become roots of their own
    and are referenced with LOAD.
    """

    def __init__(self, symbols: Sequence[str] = ()) -> None:
        self._symbols: list[str] = []
        self._symbol_index: dict[str, int] = {}
        for name in symbols:
            self.symbol(name)
        self._pending: list[Expr] = []
        self.program: ExprProgram | None = None  # set by finish()

    def symbol(self, name: str) -> int:
        index = self._symbol_index.get(name)
        if index is None:
            index = self._symbol_index[name] = len(self._symbols)
            self._symbols.append(name)
        return index

    def add(self, expr: Expr) -> int:
        """Register ``expr``; returns its future position in :meth:`finish`'s root list."""
        self._pending.append(expr)
        return len(self._pending) - 1

    def finish(self) -> tuple[EncodedExprs, list[int]]:
        """Encode; returns the program and, for each added expression in order, its root.
        The validated, ready-to-evaluate :class:`ExprProgram` is kept as ``self.program``
        (building one is the expensive part: callers that evaluate should not build another)."""
        for expr in self._pending:  # before emit() recurses that deep
            if expr._depth > MAX_EXPR_DEPTH:
                raise ValueError(f"expressions exceed the format's limits: expression nested "
                                 f"deeper than {MAX_EXPR_DEPTH}")
        uses: dict[Expr, int] = {}
        for node in iter_nodes(self._pending):
            for child in node.args:
                if child.args:
                    uses[child] = uses.get(child, 0) + 1
        for expr in self._pending:
            uses[expr] = uses.get(expr, 0) + 1
        shared = {node for node, count in uses.items() if count > 1}
        ops = bytearray()
        imms: list[int] = []
        roots: dict[Expr, int] = {}

        def emit(node: Expr, top: bool) -> None:
            if not top and node in roots:
                ops.append(OP_LOAD)
                imms.append(roots[node])
            elif node.op == "const":
                ops.append(OP_CONST)
                imms.append(int(node.value))  # type: ignore[arg-type]
            elif node.op == "sym":
                ops.append(OP_SYM)
                imms.append(self.symbol(str(node.value)))
            else:
                for child in node.args:
                    emit(child, False)
                ops.append(OPCODES[node.op])

        def emit_root(node: Expr) -> int:
            if node in roots:
                return roots[node]
            for child in iter_nodes([node]):
                if child in shared and child is not node and child.args and child not in roots:
                    emit(child, True)
                    ops.append(OP_END)
                    roots[child] = len(roots)
            emit(node, True)
            ops.append(OP_END)
            roots[node] = len(roots)
            return roots[node]

        positions = [emit_root(expr) for expr in self._pending]
        encoded = EncodedExprs(tuple(self._symbols), bytes(ops), tuple(imms))
        try:  # writers refuse what readers would refuse (see limits.py)
            self.program = ExprProgram(encoded)
        except FormatError as exc:
            raise ValueError(f"expressions exceed the format's limits: {exc}") from None
        return encoded, positions


_MISSING = object()
if TYPE_CHECKING:  # a runtime alias would cost a cold ``Callable[...]`` at import
    Evaluator = Callable[[list], int]


class ExprProgram:
    """A validated expression program, ready to evaluate.

    ``evaluate(values, root)`` takes a per-call list ``values`` laid out as
    ``[symbol values..., root cache...]`` (see :meth:`new_frame`) and returns the root's value,
    computing shared roots once per frame.
    """

    def __init__(self, encoded: EncodedExprs) -> None:
        self.encoded = encoded
        self.exprs: list[Expr] = []
        self._roots: list[Evaluator] | None = None  # built by the first value()
        self._validate(encoded)

    @property
    def symbols(self) -> tuple[str, ...]:
        return self.encoded.symbols

    @property
    def root_count(self) -> int:
        return len(self.exprs)

    def new_frame(self, symbol_values: Sequence[int | None]) -> list:
        """A fresh evaluation frame: the symbol values then one empty slot per root."""
        return [*symbol_values, *([_MISSING] * len(self.exprs))]

    def value(self, frame: list, root: int, what: str = "") -> int:
        """Evaluate root ``root`` in ``frame``; ``what`` names the field for error messages."""
        slot = self._nsym + root
        cached = frame[slot]
        if cached is not _MISSING:
            return cached
        roots = self._roots
        if roots is None:
            roots = self._build()
        try:
            result = roots[root](frame)
        except ExprEvalError as exc:
            label = f" ({what})" if what else ""
            env = ", ".join(f"{name}={frame[i]}" for i, name in enumerate(self.symbols)
                            if i < len(frame) and isinstance(frame[i], int))
            error = ExpressionError(f"cannot evaluate {self.exprs[root]}{label}: {exc}"
                                    + (f" (with {env})" if env else ""))
            error.reason = str(exc)
            raise error from None
        frame[slot] = result
        return result

    # ---- validation, then (on first evaluation) closure building -------------------------------
    def _validate(self, enc: EncodedExprs) -> None:
        """Check the whole program and build its :class:`Expr` roots. The evaluators are built
        later, by :meth:`_build`: a loaded summary needs only the expressions (the runtime
        evaluates through the planner), so a process's first ``kp.load`` does not pay for
        closures nothing calls."""
        if len(enc.symbols) > MAX_SYMBOLS:
            raise FormatError(f"expression program has {len(enc.symbols)} symbols "
                              f"(limit {MAX_SYMBOLS})")
        if len(enc.ops) > MAX_EXPR_OPS:
            raise FormatError(f"expression program has {len(enc.ops)} opcodes "
                              f"(limit {MAX_EXPR_OPS})")
        if enc.ops and enc.ops[-1] != OP_END:
            raise FormatError("expression program does not end with END")
        nsym = self._nsym = len(enc.symbols)
        exprs = self.exprs
        stack: list[Expr] = []
        # evaluation depth of each stack entry and root (one frame per operator, per LOAD and
        # for the leaf), bounded here, not left to Python's RecursionError: the tree's nesting
        # (LOADs followed, Expr._depth, what printing recurses) <= MAX_EXPR_DEPTH, and the
        # operators and LOADs on one path <= _MAX_PATH, so at most _MAX_FRAMES frames
        depths: list[int] = []
        root_depths: list[int] = []
        imm_pos = 0
        # one node per symbol and per small constant, shared by every root that reads it (the
        # summary's check walks each distinct node once)
        syms: list[Expr | None] = [None] * nsym
        consts = _CONST_CACHE
        for pos, code in enumerate(enc.ops):
            if code in _IMM_OPS:
                if imm_pos >= len(enc.imms):
                    raise FormatError(f"expression opcode at {pos} has no immediate "
                                      f"({len(enc.imms)} immediates)")
                imm = enc.imms[imm_pos]
                imm_pos += 1
                if not INT64_MIN <= imm <= INT64_MAX:
                    raise FormatError(f"expression immediate at {pos} outside int64")
                depths.append(1)
                if code == OP_CONST:
                    node = consts.get(imm) if imm.__class__ is int else None
                    stack.append(node if node is not None else const(imm))
                elif code == OP_SYM:
                    if not 0 <= imm < nsym:
                        raise FormatError(f"expression SYM index {imm} at {pos} outside "
                                          f"0..{nsym - 1}")
                    node = syms[imm]
                    if node is None:
                        node = syms[imm] = sym(enc.symbols[imm])
                    stack.append(node)
                else:
                    if not 0 <= imm < len(exprs):
                        raise FormatError(f"expression LOAD {imm} at {pos} refers to a root "
                                          f"not yet defined ({len(exprs)} so far)")
                    stack.append(exprs[imm])
                    depths[-1] = root_depths[imm] + 1
                    if depths[-1] > _MAX_FRAMES:
                        raise FormatError(_too_long_path(pos))
                if len(stack) > MAX_EXPR_STACK:
                    raise FormatError(f"expression stack deeper than {MAX_EXPR_STACK} at {pos}")
            elif code == OP_END:
                if len(stack) != 1:
                    raise FormatError(f"expression END at {pos} with {len(stack)} values on "
                                      f"the stack (expected 1)")
                root_depths.append(depths.pop())
                exprs.append(stack.pop())
                if len(exprs) > MAX_EXPR_ROOTS:
                    raise FormatError(f"expression program has more than {MAX_EXPR_ROOTS} roots")
            else:
                name = _OPNAME.get(code)
                if name is None:
                    raise FormatError(f"unknown expression opcode {code} at {pos}")
                arity = OPERATORS[name]
                if len(stack) < arity:
                    raise FormatError(f"expression stack underflow at {pos} ({name} needs "
                                      f"{arity}, has {len(stack)})")
                operands = tuple(stack[-arity:])
                del stack[-arity:]
                depth = 1 + max(depths[-arity:])
                del depths[-arity:]
                node = Expr._node(name, operands)
                if node._depth > MAX_EXPR_DEPTH:  # the tree's nesting, LOADs followed
                    raise FormatError(f"expression nested deeper than {MAX_EXPR_DEPTH} at {pos}")
                if depth > _MAX_FRAMES:
                    raise FormatError(_too_long_path(pos))
                depths.append(depth)
                stack.append(node)
        if imm_pos != len(enc.imms):
            raise FormatError(f"expression program has {len(enc.imms) - imm_pos} unused "
                              f"immediates")

    def _build(self) -> list[Evaluator]:
        """The root evaluators, from the program :meth:`_validate` accepted (so nothing is
        checked again). Idempotent: threads racing here build equal lists."""
        enc = self.encoded
        roots: list[Evaluator] = []
        stack: list[Evaluator] = []
        imms = iter(enc.imms)
        for code in enc.ops:
            if code in _IMM_OPS:
                imm = next(imms)
                if code == OP_CONST:
                    stack.append(_const_fn(imm))
                elif code == OP_SYM:
                    stack.append(_sym_fn(imm, enc.symbols[imm]))
                else:
                    stack.append(self._load_fn(imm))
            elif code == OP_END:
                roots.append(stack.pop())
            else:
                name = _OPNAME[code]
                arity = OPERATORS[name]
                fns = stack[-arity:]
                del stack[-arity:]
                stack.append(_op_fn(name, fns))
        self._roots = roots
        return roots

    def _load_fn(self, index: int) -> Evaluator:
        slot = self._nsym + index
        roots = None

        def load(frame: list) -> int:
            nonlocal roots
            cached = frame[slot]
            if cached is _MISSING:
                if roots is None:  # _build set it before any evaluator could run
                    roots = cast("list[Evaluator]", self._roots)
                cached = frame[slot] = roots[index](frame)
            return cached

        return load


# Operators and LOADs on one evaluation path (FORMAT.md §3.8), plus its leaf: the frames one
# evaluation of the path nests.
_MAX_PATH = 2 * MAX_EXPR_DEPTH
_MAX_FRAMES = _MAX_PATH + 1


def _too_long_path(pos: int) -> str:
    return (f"expression has more than {_MAX_PATH} operators and LOADs on one path at {pos} "
            f"(2 * MAX_EXPR_DEPTH)")


def _const_fn(value: int) -> Evaluator:
    return lambda frame: value


def _sym_fn(index: int, name: str) -> Evaluator:
    def read(frame: list) -> int:
        value = frame[index]
        if value is None:
            raise ExprEvalError(f"symbol {name!r} has no value")
        if INT64_MIN <= value <= INT64_MAX:
            return value
        # a uint64 scalar may hold more: fine for the kernel, not for an int64 expression
        raise ExprEvalError(f"symbol {name!r} = {shown_int(value)} is outside int64")
    return read


def _op_fn(name: str, fns: list[Evaluator]) -> Evaluator:
    # The common arithmetic gets dedicated closures (this is the plan() hot path); the rest
    # share apply_op. Overflow checks are inline.
    if name == "select":
        c, t, f = fns
        return lambda frame: t(frame) if c(frame) else f(frame)
    if len(fns) == 1:
        (a,) = fns
        return lambda frame: apply_op(name, a(frame))
    a, b = fns
    if name == "add":
        def add(frame: list) -> int:
            r = a(frame) + b(frame)
            if INT64_MIN <= r <= INT64_MAX:
                return r
            raise ExprEvalError("int64 overflow in add")
        return add
    if name == "mul":
        def mul(frame: list) -> int:
            r = a(frame) * b(frame)
            if INT64_MIN <= r <= INT64_MAX:
                return r
            raise ExprEvalError("int64 overflow in mul")
        return mul
    if name == "ceildiv":
        def ceildiv(frame: list) -> int:
            n = a(frame)  # operands left to right, as apply_op gets them: the same error first
            d = b(frame)
            if d == 0:
                raise ExprEvalError("division by zero in ceildiv")
            r = -((-n) // d)
            if INT64_MIN <= r <= INT64_MAX:
                return r
            raise ExprEvalError("int64 overflow in ceildiv")
        return ceildiv
    return lambda frame: apply_op(name, a(frame), b(frame))
