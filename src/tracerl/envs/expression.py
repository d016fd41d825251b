"""A safe evaluator of arithmetic expressions for the calculator tool (never `eval`).

The expression is parsed with `ast` and walked over a whitelist: number literals, `+ - * / // %
**`, unary `+ -` and parentheses. Names, calls, attributes, subscripts, strings and everything else
are rejected, so `__import__('os')` is a syntax the evaluator does not know rather than a
sandbox to escape. Arithmetic is exact (`Fraction`) so `0.1 + 0.2` is `0.3`; a non-integer power
falls back to float. Sizes are bounded before they are computed: the text's length, each
intermediate's magnitude, and a power's result size (estimated from logarithms before computing),
so `9**9**9` is refused at once instead of running for hours.
"""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Callable
from fractions import Fraction

# Longer inputs are not arithmetic a model needs help with; also keeps `ast.parse` cheap.
MAX_EXPRESSION_CHARS = 300
# Magnitudes (and exact denominators) beyond 10**±100 are not useful answers, and bounding every
# intermediate keeps chained powers and products from growing without limit.
MAX_ABS_LOG10 = 100.0
OUT_OF_RANGE = "result out of range (magnitude beyond 1e100 or below 1e-100)"
# Significant digits shown for a non-integer result.
DISPLAY_DIGITS = 12

Number = Fraction | float

_BINARY: dict[type[ast.operator], Callable[[Number, Number], Number]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
}


class ExpressionError(ValueError):
    """An expression the calculator refuses or cannot compute; the message is shown to the model."""


def _parse(expression: str) -> ast.Expression:
    """The syntax tree the evaluator walks, or `ExpressionError` for text it refuses to parse."""
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise ExpressionError(f"expression longer than {MAX_EXPRESSION_CHARS} characters")
    # Calculator habits: ^ for power, unicode times and divide signs.
    text = expression.replace("^", "**").replace("×", "*").replace("÷", "/").strip()
    if not text:
        raise ExpressionError("empty expression")
    try:
        return ast.parse(text, mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError) as e:
        raise ExpressionError(f"not an arithmetic expression: {expression!r}") from e


def evaluate(expression: str) -> Number:
    """The value of `expression`, or `ExpressionError` saying why not."""
    tree = _parse(expression)
    try:
        return _check(_eval(tree.body))
    except ZeroDivisionError:
        raise ExpressionError("division by zero") from None
    except (OverflowError, RecursionError) as e:
        raise ExpressionError(OUT_OF_RANGE) from e


def operations(expression: str) -> int:
    """How many binary operations `expression` has (unary signs not counted); an expression the
    evaluator would refuse counts as 0, so its error comes from `calculate`."""
    try:
        tree = _parse(expression)
    except ExpressionError:
        return 0
    return sum(isinstance(node, ast.BinOp) for node in ast.walk(tree))


def next_operation(expression: str) -> tuple[str, str] | None:
    """One step of working `expression` out by hand: the first operation (left to right) whose
    operands are both numbers, as text (`"347 * 29"`), and the expression with that operation
    replaced by its value; None when the expression is a number already. Used by the scripted
    policy of the one-operation calculator."""
    tree = ast.parse(expression.strip(), mode="eval")

    def first(node: ast.expr) -> ast.BinOp | None:
        if isinstance(node, ast.BinOp):
            for child in (node.left, node.right):
                found = first(child)
                if found is not None:
                    return found
            if _is_number(node.left) and _is_number(node.right):
                return node
        if isinstance(node, ast.UnaryOp):
            return first(node.operand)
        return None

    step = first(tree.body)
    if step is None:
        return None
    operation = ast.unparse(step)
    value = evaluate(operation)
    replacement = ast.parse(format_number(value), mode="eval").body
    rest = _replace(tree.body, step, replacement)
    return operation, ast.unparse(rest)


def _is_number(node: ast.expr) -> bool:
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        node = node.operand
    return isinstance(node, ast.Constant) and isinstance(node.value, int | float)


def _replace(node: ast.expr, old: ast.expr, new: ast.expr) -> ast.expr:
    if node is old:
        return new
    if isinstance(node, ast.BinOp):
        return ast.BinOp(_replace(node.left, old, new), node.op, _replace(node.right, old, new))
    if isinstance(node, ast.UnaryOp):
        return ast.UnaryOp(node.op, _replace(node.operand, old, new))
    return node


def format_number(value: Number) -> str:
    """An integer without a decimal point, anything else to DISPLAY_DIGITS significant digits."""
    if isinstance(value, Fraction) and value.denominator == 1:
        return str(value.numerator)
    return f"{float(value):.{DISPLAY_DIGITS}g}"


def calculate(expression: str) -> str:
    """The calculator tool: the formatted value, or `error: <why>` for the model to read."""
    try:
        return format_number(evaluate(expression))
    except ExpressionError as e:
        return f"error: {e}"


def _eval(node: ast.expr) -> Number:
    if isinstance(node, ast.Constant):
        if isinstance(node.value, bool) or not isinstance(node.value, int | float):
            raise ExpressionError(f"unsupported literal {node.value!r}")
        if isinstance(node.value, float):
            if not math.isfinite(node.value):
                raise ExpressionError(OUT_OF_RANGE)
            # From the literal's shortest text, so 0.1 is exactly 1/10, not the nearest float.
            return Fraction(repr(node.value))
        return Fraction(node.value)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.UAdd | ast.USub):
        operand = _eval(node.operand)
        return -operand if isinstance(node.op, ast.USub) else operand
    if isinstance(node, ast.BinOp):
        left, right = _check(_eval(node.left)), _check(_eval(node.right))
        if isinstance(node.op, ast.Pow):
            return _check(_power(left, right))
        op = _BINARY.get(type(node.op))
        if op is not None:
            return _check(op(left, right))
    raise ExpressionError(f"unsupported syntax: {type(node).__name__}")


def _power(base: Number, exponent: Number) -> Number:
    if isinstance(exponent, Fraction) and exponent.denominator == 1:
        if isinstance(base, Fraction) and base != 0:
            # Digits of the exact result's numerator and denominator, before computing it.
            digits = abs(float(exponent)) * max(
                math.log10(abs(base.numerator)), math.log10(base.denominator)
            )
            if digits > MAX_ABS_LOG10 + 1:
                raise ExpressionError(OUT_OF_RANGE)
        if base == 0 and exponent < 0:
            raise ZeroDivisionError
        return base ** int(exponent)
    if base < 0:
        raise ExpressionError("a negative number to a fractional power is not a real number")
    return float(base) ** float(exponent)


def _check(value: Number) -> Number:
    """Refuse values whose magnitude, or whose exact denominator, is out of range."""
    if value == 0:
        return value
    if isinstance(value, float):
        if not math.isfinite(value) or abs(math.log10(abs(value))) > MAX_ABS_LOG10:
            raise ExpressionError(OUT_OF_RANGE)
        return value
    magnitude = math.log10(abs(value.numerator)) - math.log10(value.denominator)
    if abs(magnitude) > MAX_ABS_LOG10 or math.log10(value.denominator) > MAX_ABS_LOG10:
        raise ExpressionError(OUT_OF_RANGE)
    return value
