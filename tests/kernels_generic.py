from typing import Any

import warp as wp


@wp.kernel
def scale_any(x: wp.array(dtype=Any), y: wp.array(dtype=Any)):
    i = wp.tid()
    y[i] = x[i] + x[i]
