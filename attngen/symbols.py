"""The sympy vocabulary shared by every pipeline stage (tracer, predicates, printers).

Element level (what a mod sees):
  SCORE  the already-scaled q.k value (fp32)
  Q, KV  absolute query / key positions (Q includes the runtime q_offset)
  B, H   batch and (query) head index
  Load(Symbol(name), *idx)  an element of captured tensor ``name`` (or of a runtime per-block
         summary array), indexed with integer expressions; value type from the tensor's dtype.

Runtime parameters (attngen/params.py): ``param_symbol(slot, integer, minimum)``, named p0, p1, ... in
first-use order, with the assumptions the predicates may use (integer >= 0 / >= 1, or a positive real);
codegen prints them as reads of ``c.iparam[slot]`` / ``c.fparam[slot]``.

Tile level (what the predicates are written in):
  I, J           q-block and kv-block index
  BQ, BK         block (tile) sizes in rows / columns
  QLEN, KVLEN    runtime sequence lengths;  QOFF  runtime q_offset (added to every row index)

Integer semantics are Python's: ``floor(a/b)`` is floor division and ``Mod`` takes the sign of the
divisor, which is what sympy gives for integer symbols.
"""
import sympy

SCORE = sympy.Symbol("score", real=True)
Q = sympy.Symbol("q_idx", integer=True)
KV = sympy.Symbol("kv_idx", integer=True)
B = sympy.Symbol("b", integer=True, nonnegative=True)
H = sympy.Symbol("h", integer=True, nonnegative=True)

I = sympy.Symbol("i", integer=True, nonnegative=True)
J = sympy.Symbol("j", integer=True, nonnegative=True)
BQ = sympy.Symbol("BQ", integer=True, positive=True)
BK = sympy.Symbol("BK", integer=True, positive=True)
QLEN = sympy.Symbol("QLEN", integer=True, positive=True)
KVLEN = sympy.Symbol("KVLEN", integer=True, positive=True)
QOFF = sympy.Symbol("QOFF", integer=True)

ELEMENT_SYMBOLS = (SCORE, B, H, Q, KV)
TILE_SYMBOLS = (I, J, BQ, BK, QLEN, KVLEN, QOFF, B, H)


def param_symbol(slot: int, integer: bool, minimum=None) -> sympy.Symbol:
    """The symbol of runtime parameter ``slot``: its assumptions are all the predicates know of its value."""
    if not integer:
        return sympy.Symbol(f"p{slot}", positive=True)  # real positive: softcap's cap, ALiBi's base
    bound = {None: {}, 0: {"nonnegative": True}, 1: {"positive": True}}[minimum]
    return sympy.Symbol(f"p{slot}", integer=True, **bound)


class Load(sympy.Function):
    """Load(Symbol('t0'), i0, i1, ...): element of a floating-point captured tensor, read as fp32.

    Kept unevaluated; the first argument names the array, the rest are integer index expressions.
    ILoad is the same for integer and bool tensors and runtime int arrays (read as int).
    """

    is_real = True

    @classmethod
    def eval(cls, name, *idx):
        return None

    def _sympystr(self, printer):
        name, *idx = self.args
        return f"{name}[{', '.join(printer.doprint(i) for i in idx)}]"


class ILoad(Load):
    """Load of an integer/bool array element (value is an integer)."""

    is_integer = True


def load(name: str, *idx, integer: bool = False) -> sympy.Expr:
    cls = ILoad if integer else Load
    return cls(sympy.Symbol(name), *[sympy.sympify(i) for i in idx])
