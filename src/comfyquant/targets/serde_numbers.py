"""How serde_json reads and prints JSON numbers, which safetensors' header messages quote.

serde_json 1.x (without ``float_roundtrip``) does not always read a float as Python does, and
Rust prints an f64 in its own style; both are shared by the header reader
(``container``) and the header's syntax walk (``serde_syntax``).
"""

from __future__ import annotations

from decimal import Decimal

U64 = (1 << 64) - 1
_U64 = U64
_POW10 = [float(f"1e{i}") for i in range(309)]


def _overflows(a: int, b: int, c: int) -> bool:
    """serde_json's ``overflow!(a * 10 + b, c)``."""
    return a >= c // 10 and (a > c // 10 or b > c % 10)


def serde_number(token: str) -> int | float:
    """A JSON number as serde_json 1.x reads it (without ``float_roundtrip``): integers that
    fit u64 (or i64 when negative) stay integers, ``-0`` and every other integer become f64;
    floats are ``significand (u64, later digits dropped) x 10^exponent`` in one multiplication
    or division by a power of ten, which is not always the correctly rounded value Python
    gives (``1.1305118554741463e-56`` reads as ``...465e-56``)."""
    negative = token.startswith("-")
    digits = token[1:] if negative else token
    i, n = 0, len(digits)
    significand, exponent, is_float = 0, 0, False
    while i < n and digits[i].isdigit():
        d = ord(digits[i]) - 48
        if is_float or _overflows(significand, d, _U64):
            is_float = True  # parse_long_integer: later digits only scale
            exponent += 1
        else:
            significand = significand * 10 + d
        i += 1
    if i < n and digits[i] == ".":
        is_float = True
        i += 1
        dropping = False
        while i < n and digits[i].isdigit():
            d = ord(digits[i]) - 48
            if dropping or _overflows(significand, d, _U64):
                dropping = True  # parse_decimal_overflow: ignore further digits
            else:
                significand = significand * 10 + d
                exponent -= 1
            i += 1
    if i < n and digits[i] in "eE":
        is_float = True
        i += 1
        sign = 1
        if digits[i] in "+-":
            sign = -1 if digits[i] == "-" else 1
            i += 1
        exp = int(digits[i:])
        if exp > 2**31 - 1:
            return (-0.0 if negative else 0.0) if sign < 0 or significand == 0 else float("-inf" if negative else "inf")
        exponent = max(-(2**31), min(2**31 - 1, exponent + sign * exp))
    if not is_float:
        if not negative:
            return significand
        return -significand if 0 < significand <= 2**63 else -float(significand)
    f = float(significand)
    while True:
        if abs(exponent) < len(_POW10):
            f = f * _POW10[exponent] if exponent >= 0 else f / _POW10[-exponent]
            break
        if f == 0.0 or exponent >= 0:
            f = f * float("inf") if exponent >= 0 and f else f
            break
        f /= 1e308
        exponent += 308
    return -f if negative else f


def out_of_range_stop(token: str) -> int:
    """How much of an out-of-range number serde_json reads before it refuses it: the whole
    token, except for an exponent beyond i32 (with a non-zero significand and no minus sign),
    which it refuses at the digit that overflows (``1e99999999999`` ends after ``1e9999999999``)."""
    e = max(token.find("e"), token.find("E"))
    if e == -1:
        return len(token)
    i = e + 1
    if token[i : i + 1] in ("+", "-"):
        if token[i] == "-":
            return len(token)
        i += 1
    if not any(c in "123456789" for c in token[:e]):
        return len(token)  # a zero significand: serde_json reads the exponent to its end
    exp = 0
    for j in range(i, len(token)):
        digit = ord(token[j]) - 48
        if j > i and _overflows(exp, digit, 2**31 - 1):
            return j + 1
        exp = exp * 10 + digit
    return len(token)


def rust_float(x: float) -> str:
    """serde's rendering of an f64 in messages: shortest round-trip digits, positional for
    1e-5 <= |x| < 1e16 (with ``.0`` when integral), else ``1.5e-7`` / ``1e+16``."""
    if x == 0:
        return "-0.0" if str(x).startswith("-") else "0.0"
    d = Decimal(repr(x))
    sign, digits, exponent = d.as_tuple()
    if not isinstance(exponent, int):  # "n"/"N"/"F": NaN and the infinities have no digits
        raise ValueError(f"{x!r} is not a finite number")
    sci = len(digits) - 1 + exponent
    if -5 <= sci < 16:
        s = format(d, "f")
        return s if "." in s else s + ".0"
    mant = str(digits[0]) + ("." + "".join(map(str, digits[1:])) if len(digits) > 1 else "")
    return f"{'-' if sign else ''}{mant}e{'+' if sci >= 0 else '-'}{abs(sci)}"
