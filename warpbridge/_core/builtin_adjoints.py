"""Which Warp builtins' adjoints lose a gradient, as measured on the Warp version below.

``tests/builtin_sweep.py`` checks every builtin that takes floating arguments, and every tile
builtin, against float64 finite differences, parameter by parameter; ``tests/test_builtin_adjoints.py``
fails when what it measures and this table disagree (a Warp release that fixes or breaks one).

The rule: a call loses the gradient of a floating parameter when Warp generates no adjoint for
the overload (its ``is_differentiable`` flag) and the result is floating, unless the builtin's
derivative is zero almost everywhere or its result shares the argument's storage; and for the
few builtins below whose adjoint skips some parameters although Warp marks them differentiable.
Rule 7 refuses a gradient through such a call (``adjoint_check.call_hazards``).
"""

from __future__ import annotations

MEASURED_ON = "1.19"  # the warp-lang version the sweep measured this table on

# No adjoint, and none needed: the derivative is zero almost everywhere (rounding and signs)
ZERO_ALMOST_EVERYWHERE = frozenset({"ceil", "floor", "floordiv", "nonzero", "rint", "round", "sign", "step", "trunc"})

# No adjoint of its own, but the result is a view of the argument: gradients reach it through
# the shared storage (measured right)
VIEWS = frozenset({"tile_view"})

# Differentiable by Warp's flag, but the adjoint drops the gradient of these parameters
# (measured 0 where finite differences are not): mod(a, b) with respect to b (-floor(a / b)),
# curlnoise with respect to its octaves' lacunarity and gain
LOST_PARAMETERS = {"mod": frozenset({"b"}), "curlnoise": frozenset({"lacunarity", "gain"})}


def lost_gradients(
    builtin: str, differentiable: bool, floating: tuple[str, ...], floating_result: bool
) -> frozenset[str]:
    """The floating parameters of a call whose gradient Warp's adjoint loses (empty: none).

    ``differentiable`` is Warp's flag for the overload the call resolved to, ``floating`` its
    parameters that take a floating value or tile, ``floating_result`` whether it returns one.
    """
    if not floating_result or builtin in ZERO_ALMOST_EVERYWHERE or builtin in VIEWS:
        return frozenset()
    if not differentiable:
        return frozenset(floating)
    return LOST_PARAMETERS.get(builtin, frozenset()) & frozenset(floating)
