"""Symbolic integer expressions: how a summary says "this size depends on that shape".

An :class:`Expr` is an immutable tree over int64: constants, named symbols (tensor dims such as
``n``, integer scalar parameters, loop counters) and a fixed set of operators. Expressions are
*data*: the artifact stores them as a postfix program (:mod:`kernelpack.expr_program`) and the
loader evaluates them with checked arithmetic. Nothing here ever builds or evals Python source.

Building folds constants and applies a few identities (``x + 0``, ``x * 1``, ``cdiv(x, 1)``...)
so that printed summaries stay readable: ``cdiv(n, 256)`` rather than ``((n + 255) // 256)``.
The identities are exact over the integers, and what is stored and evaluated is the folded
expression: ``-(-a)`` is ``a``, so no intermediate of the form as written (``-a`` for
``a = INT64_MIN``) is computed or can overflow. ``Expr(op, args, value)`` makes one node as
given, unfolded.

Python operators build expressions: ``+ - * // % << >>``, unary ``-`` and the orderings
``< <= > >=``. ``==`` and ``!=`` keep their structural meaning (expressions are dict keys);
use :func:`eq` / :func:`ne` for symbolic equality. Inside a ``@kp.fusion`` trace a dim used
with a float or with ``/ ** & | ^`` becomes a traced int64 value (``1.0 / x.shape[1]``).

How an expression is written out (``str``, :func:`canonical_text` for cache keys) and walked
(:func:`iter_nodes`) is :mod:`kernelpack.expr_text`; its names are importable from here too.
"""

from __future__ import annotations

import operator
from typing import Any, Callable, Iterable, Mapping, Union

from .dtypes import is_numpy_bool
from . import expr_eval as _expr_eval, expr_text as _expr_text
from .expr_eval import INT64_MAX, INT64_MIN, ExprEvalError, apply_op, evaluate
from .expr_text import _PRINT_NODES, _format, canonical_text, iter_nodes
from .limits import MAX_NAME_LENGTH, fits_name, shown_int

__all__ = [
    "Expr", "ExprLike", "sym", "const", "as_expr",
    "cdiv", "product", "floordiv", "mod", "emin", "emax", "shl", "shr", "select",
    "eq", "ne", "lt", "le", "gt", "ge", "land", "lor", "lnot",
    "INT64_MIN", "INT64_MAX", "OPERATORS", "evaluate", "canonical_text", "can_fail",
]

# operator name -> arity. The names are stable: the format maps them to opcodes.
OPERATORS: dict[str, int] = {
    "add": 2, "sub": 2, "mul": 2, "floordiv": 2, "ceildiv": 2, "mod": 2, "min": 2, "max": 2,
    "shl": 2, "shr": 2, "eq": 2, "ne": 2, "lt": 2, "le": 2, "gt": 2, "ge": 2,
    "and": 2, "or": 2, "not": 1, "neg": 1, "select": 3,
}
_COMMUTATIVE = frozenset({"add", "mul", "min", "max", "eq", "ne", "and", "or"})

ExprLike = Union["Expr", int, str]


def _substitute(root: Expr, mapping: Mapping[str, ExprLike], done: dict[int, Expr]) -> Expr:
    """:meth:`Expr.substitute` of ``root``; ``done`` maps id(node) -> its substitute (nodes
    live for the call). A loop over an explicit stack, children before parents: recursing
    ran out of Python's stack on a sum of 500 symbols, a tree :meth:`Expr.evaluate` refuses
    by name (review 35); and a function of its own, not a closure calling itself (a reference
    cycle that every call left to the garbage collector)."""
    def rebuilt(a: Expr) -> Expr:
        if a.op == "sym":
            return as_expr(mapping[a.value]) if a.value in mapping else a  # type: ignore[index]
        return a if a.op == "const" else done[id(a)]

    stack: list[tuple[Expr, bool]] = [(root, False)]
    while stack:
        e, children_done = stack.pop()
        if e.op in ("sym", "const") or id(e) in done:
            continue
        if children_done:
            done[id(e)] = _make(e.op, *[rebuilt(a) for a in e.args])
        else:
            stack.append((e, True))
            stack.extend((a, False) for a in e.args)
    return rebuilt(root)


def _binop(op: str, reflected: bool = False) -> Callable[["Expr", object], "Expr"]:
    """An Expr operator method: ``self op other`` (or ``other op self``). An operand that is no
    int, symbol name or expression gives NotImplemented, except a float or complex number
    inside a ``@kp.fusion`` trace (see :func:`_traced`)."""
    dunder = f"__{'r' if reflected else ''}{_DUNDER.get(op, op)}__"

    def method(self: "Expr", o: object) -> "Expr":
        try:
            other = as_expr(o)  # type: ignore[arg-type]
        except TypeError:
            if isinstance(o, (float, complex)):
                return _traced(self, dunder, o)
            return NotImplemented
        return _make(op, other, self) if reflected else _make(op, self, other)
    method.__name__ = dunder
    return method


_DUNDER = {"shl": "lshift", "shr": "rshift"}


# NumPy's ufuncs of Expr's operators: ``np.int64(3) + n`` reaches Expr.__array_ufunc__
_NUMPY_OPERATORS: dict[str, Callable[[Any, Any], Any]] = {
    "add": operator.add, "subtract": operator.sub, "multiply": operator.mul,
    "floor_divide": operator.floordiv, "remainder": operator.mod, "left_shift": operator.lshift,
    "right_shift": operator.rshift, "less": operator.lt, "less_equal": operator.le,
    "greater": operator.gt, "greater_equal": operator.ge}


def _traced(self: "Expr", dunder: str, o: object) -> Any:
    """Inside a ``@kp.fusion`` trace, a dim combined with a float (``1.0 / x.shape[1]``) or by
    an operator no int64 expression has (``/``, ``**``, ``&``, ``|``, ``^``) is the dim as a
    traced int64 value, as in ``x / x.shape[1]``: NumPy's rules then apply. Outside a trace,
    NotImplemented (Python's TypeError)."""
    from .tracing import current_graph, trace_value  # tracing builds on this module

    graph = current_graph()
    if graph is None:
        return NotImplemented
    return getattr(trace_value(graph, self), dunder)(o)


def _traced_only(name: str) -> Callable[["Expr", object], object]:
    def method(self: "Expr", o: object) -> object:
        return _traced(self, name, o)
    method.__name__ = name
    return method


class Expr:
    """An immutable symbolic int64 expression node.

    ``op`` is ``"const"`` (``value`` holds the int), ``"sym"`` (``value`` holds the name) or an
    operator name from :data:`OPERATORS` with ``args``.
    """

    __slots__ = ("op", "args", "value", "_hash", "_depth")

    def __init__(self, op: str, args: tuple["Expr", ...] = (), value: int | str | None = None):
        """A node checked as the builders (:func:`const`, :func:`sym`, the operators) check
        theirs: an unchecked public constructor let ``Expr("const", (), 1.5)`` print as 1.5
        and evaluate as 1, and ``Expr("add", (a, b, c))`` drop ``c``. TypeError for a wrong
        type, ValueError for a wrong value. (kernelpack's own builders and the format reader,
        which have checked their nodes, make them with :meth:`_node`.)"""
        _check_node(op, args, value)
        self._set(op, args, value)

    @classmethod
    def _node(cls, op: str, args: tuple["Expr", ...] = (),
              value: int | str | None = None) -> "Expr":
        """A node whose parts the caller has checked (no :func:`_check_node`: decoding and
        simplifying make many)."""
        node = object.__new__(cls)
        node._set(op, args, value)
        return node

    def _set(self, op: str, args: tuple["Expr", ...], value: int | str | None) -> None:
        self.op = op
        self.args = args
        self.value = value
        # a constant hashes as its int, which it equals (__eq__)
        self._hash = hash(value) if op == "const" else hash((op, args, value))
        # nesting: what recurses refuses a tree deeper than MAX_EXPR_DEPTH up front
        self._depth: int = 1 + max([a._depth for a in args]) if args else 1

    # ---- structure -------------------------------------------------------------------------
    def __eq__(self, other: object) -> bool:
        if self is other:
            return True
        if not isinstance(other, Expr):
            # a constant equals its int (``x.shape[1] == 3`` for a literal or static dim of 3,
            # as ``<``, ``int()`` and ``range()`` already take it); a symbolic expression
            # equals no int (structural equality: ``kp.eq`` compares values)
            if isinstance(other, int) and not isinstance(other, bool):
                return self.op == "const" and self.value == other
            return NotImplemented
        if self._hash != other._hash or self.op != other.op or self.value != other.value:
            return False
        if self._depth < 8:  # a small tree: at most a few thousand nodes
            return self.args == other.args
        # each pair of nodes once: equal, distinct copies of a shared chain (a file can hold
        # two) would otherwise be compared tree by tree, exponentially
        stack, seen = [(self, other)], set()
        while stack:
            a, b = stack.pop()
            if a is b or (id(a), id(b)) in seen:
                continue
            seen.add((id(a), id(b)))
            if (a._hash != b._hash or a.op != b.op or a.value != b.value
                    or len(a.args) != len(b.args)):
                return False
            stack.extend(zip(a.args, b.args))
        return True

    def __ne__(self, other: object) -> bool:
        result = self.__eq__(other)
        return result if result is NotImplemented else not result

    def __hash__(self) -> int:
        return self._hash

    def __reduce__(self) -> tuple:
        """Pickle by structure, never the cached ``_hash``: ``hash(str)`` differs between
        processes (PYTHONHASHSEED), so a stored hash made an expression sent to a spawned
        worker unequal to the worker's own ``kp.sym("n")``."""
        return (Expr, (self.op, self.args, self.value))

    def __call__(self, *args: object, **kwargs: object) -> "Expr":
        """Never callable; this only words the error. A traced tensor's ``size`` is NumPy's
        element count (an expression), so torch's ``x.size(0)`` lands here: Python's own
        "'Expr' object is not callable" would leave that user guessing."""
        raise TypeError(f"an integer expression is not callable (got a call on {self}): for "
                        f"a dimension write x.shape[i]; x.size is the element count, as in "
                        f"NumPy, not torch's x.size(i) method")

    def __copy__(self) -> "Expr":
        return self  # immutable

    def __deepcopy__(self, memo: dict) -> "Expr":
        return self

    def __bool__(self) -> bool:
        if self.op == "const":
            return bool(self.value)
        raise TypeError(f"the truth of a symbolic expression is unknown until evaluated "
                        f"(got {self}); use kp.select or a variant predicate")

    def __index__(self) -> int:
        if self.op == "const":
            return int(self.value)  # type: ignore[arg-type]
        from .promotion import dim_number_error  # promotion builds on this module

        raise dim_number_error(self, "int() (or range(), an index)")

    __int__ = __index__

    # Python's numeric protocols on a dim. abs/round/floor/ceil/trunc of an integer are exact
    # integers again, so they stay symbolic; float()/complex() (and math.sqrt, math.log, which
    # call float()) must return a number, which a dim is not until launch: inside a fusion that
    # is a TraceError naming the kp form (it was "not a constant expression" or "bad operand
    # type for abs()").
    def __float__(self) -> float:
        if self.op == "const":
            return float(self.value)  # type: ignore[arg-type]
        from .promotion import dim_number_error  # promotion builds on this module

        raise dim_number_error(self, "float() (or math.sqrt, math.log, ...)")

    def __complex__(self) -> complex:
        if self.op == "const":
            return complex(self.value)  # type: ignore[arg-type]
        from .promotion import dim_number_error  # promotion builds on this module

        raise dim_number_error(self, "complex()")

    def __abs__(self) -> "Expr":
        return select(lt(self, 0), -self, self)

    def __round__(self, ndigits: object = None) -> "Expr":
        if ndigits is None or (isinstance(ndigits, int) and ndigits >= 0):
            return self  # round(int) and round(int, k >= 0) are the int itself
        if self.op == "const" and isinstance(ndigits, int):
            return const(round(int(self.value), ndigits))  # type: ignore[arg-type]
        raise TypeError(f"round() of {self} with ndigits={ndigits!r}: only ndigits None or "
                        f">= 0 keeps a symbolic size exact")

    def __trunc__(self) -> "Expr":
        return self

    def __floor__(self) -> "Expr":
        return self

    def __ceil__(self) -> "Expr":
        return self

    def __divmod__(self, other: object) -> tuple["Expr", "Expr"]:
        return self // other, self % other  # type: ignore[operator]

    def __rdivmod__(self, other: object) -> tuple["Expr", "Expr"]:
        return other // self, other % self  # type: ignore[operator]

    def __array_ufunc__(self, ufunc: Any, method: str, *inputs: Any, **kwargs: Any) -> Any:
        """``np.sqrt(x.shape[-1])`` inside a fusion (the attention scale) is the kp op on
        the traced size, as ``kp.sqrt`` is. Outside a trace, a NumPy integer on the left of an
        expression operator (``np.int64(3) + n``, ``np.prod(shape) * n``) is the same
        expression as on the right, where Python calls Expr's method; any other ufunc gets
        NotImplemented (NumPy's TypeError: a symbolic size has no value to compute with)."""
        from .graph import current_graph  # the graph builds on this module

        graph = current_graph()
        if graph is None:
            op = _NUMPY_OPERATORS.get(ufunc.__name__)
            if op is None or method != "__call__" or kwargs or len(inputs) != 2:
                return NotImplemented
            try:  # a NumPy integer or 0-d integer array; never a float, bool or array
                a, b = (as_expr(v) for v in inputs)
            except TypeError:
                return NotImplemented
            return op(a, b)
        from .numpy_interop import array_ufunc
        from .promotion import trace_value

        traced = tuple(trace_value(graph, v) if isinstance(v, Expr) else v for v in inputs)
        return array_ufunc(ufunc, method, traced, kwargs)

    @property
    def is_const(self) -> bool:
        return self.op == "const"

    @property
    def is_sym(self) -> bool:
        return self.op == "sym"

    def symbols(self) -> set[str]:
        """Names of all symbols the expression reads. Each node once: a loaded program's
        LOADs make a DAG whose tree is exponentially larger (a hostile file must not hang)."""
        nodes = iter_nodes((self,))
        return {node.value for node in nodes if node.op == "sym"}  # type: ignore[misc]

    def substitute(self, mapping: Mapping[str, ExprLike]) -> "Expr":
        """Replace symbols by expressions (re-simplifying on the way up). Each node is
        rebuilt once: a node shared by several parents (a loaded program's LOADs, or
        ``e = e + e * m`` built in a loop) must not be walked once per path to it."""
        return _substitute(self, mapping, {})

    def evaluate(self, env: Mapping[str, int] | None = None, **symbols: int) -> int:
        """Evaluate with checked int64 arithmetic; raises ExpressionError on overflow etc."""
        values = dict(env or {}, **symbols)
        return evaluate(self, values)

    # ---- printing --------------------------------------------------------------------------
    def __repr__(self) -> str:
        return f"Expr({self})"

    def __str__(self) -> str:
        return _format(self, -1, [_PRINT_NODES])

    # ---- operators -------------------------------------------------------------------------
    # A right operand that is no ExprLike gives NotImplemented, so Python asks the other side:
    # ``x.shape[0] * x`` with x a traced tensor is the tensor's reflected multiply.
    __add__, __radd__ = _binop("add"), _binop("add", reflected=True)
    __sub__, __rsub__ = _binop("sub"), _binop("sub", reflected=True)
    __mul__, __rmul__ = _binop("mul"), _binop("mul", reflected=True)
    __floordiv__, __rfloordiv__ = _binop("floordiv"), _binop("floordiv", reflected=True)
    __mod__, __rmod__ = _binop("mod"), _binop("mod", reflected=True)
    __lshift__, __rlshift__ = _binop("shl"), _binop("shl", reflected=True)
    __rshift__, __rrshift__ = _binop("shr"), _binop("shr", reflected=True)
    def __neg__(self) -> "Expr": return _make("neg", self)
    def __pos__(self) -> "Expr": return self
    __lt__, __le__, __gt__, __ge__ = _binop("lt"), _binop("le"), _binop("gt"), _binop("ge")
    # Only inside a fusion trace (the dim becomes a traced int64 value): see _traced.
    __truediv__, __rtruediv__ = _traced_only("__truediv__"), _traced_only("__rtruediv__")
    __pow__, __rpow__ = _traced_only("__pow__"), _traced_only("__rpow__")
    __and__, __rand__ = _traced_only("__and__"), _traced_only("__rand__")
    __or__, __ror__ = _traced_only("__or__"), _traced_only("__ror__")
    __xor__, __rxor__ = _traced_only("__xor__"), _traced_only("__rxor__")


# ---- construction ------------------------------------------------------------------------------
# expr_eval's and expr_text's annotations name Expr (typing.get_type_hints resolves them in
# their globals); they cannot import it, since this module imports them
_expr_eval.Expr = _expr_text.Expr = Expr  # type: ignore[misc]


def _check_node(op: object, args: object, value: object) -> None:
    """What :class:`Expr`'s public constructor refuses: an unknown operator, a wrong operand
    count, an operand that is no Expr, a constant that is no int64 int, a symbol name that
    :func:`sym` would refuse, and a value beside an operator."""
    if not isinstance(op, str):
        raise TypeError(f"an expression's op must be a str (got {type(op).__name__})")
    if not isinstance(args, tuple):
        raise TypeError(f"an expression's args must be a tuple (got {type(args).__name__})")
    if op in ("const", "sym"):
        if args:
            raise ValueError(f"a {op} expression has no operands (got {len(args)})")
        if op == "sym":
            if not isinstance(value, str):
                raise TypeError(f"a sym expression's value is its name, a str (got "
                                f"{type(value).__name__})")
            sym(value)  # the name's own checks
        elif isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"a const expression's value must be an int (got {value!r:.80})")
        else:
            const(value)  # the int64 range, as const() checks it
        return
    arity = OPERATORS.get(op)
    if arity is None:
        raise ValueError(f"unknown expression operator {op!r} (known: const, sym, "
                         f"{', '.join(OPERATORS)})")
    if len(args) != arity:
        raise ValueError(f"operator {op!r} takes {arity} operand{'s' if arity > 1 else ''} "
                         f"(got {len(args)})")
    for a in args:
        if not isinstance(a, Expr):
            raise TypeError(f"operator {op!r}: operands must be Exprs (got "
                            f"{type(a).__name__}: {a!r:.80})")
    if value is not None:
        raise ValueError(f"operator {op!r} takes no value (got {value!r:.80})")


_CONST_CACHE: dict[int, Expr] = {}


def const(value: int) -> Expr:
    """A constant; must fit in int64."""
    if isinstance(value, bool):
        value = int(value)
    if not isinstance(value, int):
        raise TypeError(f"an expression constant must be an int (got {value!r})")
    if not INT64_MIN <= value <= INT64_MAX:
        raise ValueError(f"expression constant outside int64 (got {shown_int(value)})")
    node = _CONST_CACHE.get(value)
    if node is None:
        node = Expr._node("const", (), value)
        if -1024 <= value <= 1024:
            _CONST_CACHE[value] = node
    return node


def sym(name: str) -> Expr:
    """A named symbol: a tensor dim (``"n"``), an integer scalar parameter, or a loop counter."""
    if not isinstance(name, str):  # misuse of the API: the type is wrong, not the value
        raise TypeError(f"a symbol name must be a str (got {type(name).__name__}: {name!r})")
    if not name or not name.isidentifier():
        raise ValueError(f"a symbol name must be a Python identifier (got {name!r:.80})")
    if not fits_name(name):
        raise ValueError(f"a symbol name must be at most {MAX_NAME_LENGTH} UTF-8 bytes, as every "
                         f"name in an artifact (got {len(name.encode())}: {name!r:.80})")
    return Expr._node("sym", (), name)


def as_expr(value: ExprLike) -> Expr:
    """Accept an Expr, an int (constant) or a str (symbol name)."""
    if isinstance(value, Expr):
        return value
    if isinstance(value, str):
        return sym(value)
    if isinstance(value, int):
        return const(value)
    index = getattr(value, "__index__", None)
    if index is not None and not is_numpy_bool(value):  # NumPy integers (not its bool,
        return const(index())  # whose __index__ NumPy before 2.3 keeps, deprecated)
    raise TypeError(f"expected an int, a symbol name or an expression (got {value!r:.80})")


def cdiv(a: ExprLike, b: ExprLike) -> Expr:
    """Ceiling division ``ceil(a / b)``, the usual grid-size helper."""
    return _make("ceildiv", as_expr(a), as_expr(b))


def product(dims: Iterable[ExprLike]) -> Expr:
    """``dims`` multiplied together, left to right from ``const(1)`` (a shape's element count)."""
    total: Expr = const(1)
    for d in dims:
        total = total * d
    return total


def floordiv(a: ExprLike, b: ExprLike) -> Expr: return _make("floordiv", as_expr(a), as_expr(b))
def mod(a: ExprLike, b: ExprLike) -> Expr: return _make("mod", as_expr(a), as_expr(b))
def emin(a: ExprLike, b: ExprLike) -> Expr: return _make("min", as_expr(a), as_expr(b))
def emax(a: ExprLike, b: ExprLike) -> Expr: return _make("max", as_expr(a), as_expr(b))
def shl(a: ExprLike, b: ExprLike) -> Expr: return _make("shl", as_expr(a), as_expr(b))
def shr(a: ExprLike, b: ExprLike) -> Expr: return _make("shr", as_expr(a), as_expr(b))
def eq(a: ExprLike, b: ExprLike) -> Expr: return _make("eq", as_expr(a), as_expr(b))
def ne(a: ExprLike, b: ExprLike) -> Expr: return _make("ne", as_expr(a), as_expr(b))
def lt(a: ExprLike, b: ExprLike) -> Expr: return _make("lt", as_expr(a), as_expr(b))
def le(a: ExprLike, b: ExprLike) -> Expr: return _make("le", as_expr(a), as_expr(b))
def gt(a: ExprLike, b: ExprLike) -> Expr: return _make("gt", as_expr(a), as_expr(b))
def ge(a: ExprLike, b: ExprLike) -> Expr: return _make("ge", as_expr(a), as_expr(b))
def land(a: ExprLike, b: ExprLike) -> Expr: return _make("and", as_expr(a), as_expr(b))
def lor(a: ExprLike, b: ExprLike) -> Expr: return _make("or", as_expr(a), as_expr(b))
def lnot(a: ExprLike) -> Expr: return _make("not", as_expr(a))


def select(cond: ExprLike, if_true: ExprLike, if_false: ExprLike) -> Expr:
    """``if_true`` where ``cond`` is non-zero, else ``if_false``; only the chosen side is
    evaluated, so ``select(n > 0, m // n, 0)`` never divides by zero."""
    return _make("select", as_expr(cond), as_expr(if_true), as_expr(if_false))


# ---- simplification ----------------------------------------------------------------------------
def _make(op: str, *args: Expr) -> Expr:
    if op not in OPERATORS or OPERATORS[op] != len(args):
        raise ValueError(f"bad expression operator {op!r} with {len(args)} operands")
    if op == "select":
        c, t, f = args
        if c.is_const:
            return t if c.value else f
        if t == f and _cannot_fail(c):  # a condition that can fail must still be evaluated
            return t
        return Expr._node(op, args)
    if all(a.is_const for a in args):
        try:
            return const(apply_op(op, *(int(a.value) for a in args)))  # type: ignore[arg-type]
        except ExprEvalError:
            return Expr._node(op, args)  # keep it: evaluation reports the error with context
    if op in _COMMUTATIVE and args[0].is_const and not args[1].is_const:
        args = (args[1], args[0])
    simplified = _identity(op, args)
    return simplified if simplified is not None else Expr._node(op, args)


_FALLIBLE = frozenset({"add", "sub", "mul", "floordiv", "ceildiv", "mod", "neg", "shl", "shr"})


def can_fail(e: Expr) -> bool:
    """Whether evaluating ``e`` may raise (a division by zero, an int64 overflow, a shift
    count outside 0..63); a large expression counts as one that may."""
    return not _cannot_fail(e)


def _cannot_fail(e: Expr, budget: int = 32) -> bool:
    """Whether evaluating ``e`` can never raise; a large one counts as fallible."""
    stack = [e]
    while stack:
        node = stack.pop()
        budget -= 1
        if budget < 0 or node.op in _FALLIBLE:
            return False
        stack.extend(node.args)
    return True


def _identity(op: str, args: tuple[Expr, ...]) -> Expr | None:
    a = args[0]
    b = args[1] if len(args) > 1 else None
    bv = b.value if b is not None and b.is_const else None
    if op == "neg" and a.op == "neg":
        return a.args[0]
    if op in ("add", "sub") and bv == 0:
        return a
    if op == "add" and bv is not None and a.op == "add" and a.args[1].is_const:
        total = int(a.args[1].value) + int(bv)  # type: ignore[arg-type]
        if INT64_MIN <= total <= INT64_MAX:
            return _make("add", a.args[0], const(total))
    # x - x and x * 0 drop x: only where x cannot fail (1 // n * 0 raises for n = 0)
    if op == "sub" and a == b and _cannot_fail(a):
        return const(0)
    if op == "mul" and bv == 1:
        return a
    if op == "mul" and bv == 0 and _cannot_fail(a):
        return const(0)
    if op == "mul" and bv is not None and a.op == "mul" and a.args[1].is_const:
        product = int(a.args[1].value) * int(bv)  # type: ignore[arg-type]
        if INT64_MIN <= product <= INT64_MAX:
            return _make("mul", a.args[0], const(product))
    if op in ("floordiv", "ceildiv") and bv == 1:
        return a
    if op in ("shl", "shr") and bv == 0:
        return a
    if op in ("min", "max") and a == b:
        return a
    return None
