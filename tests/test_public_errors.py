"""Every public neighbour op, every argument, hostile values: the right answer or a
WarpBridgeError that starts with the op's public name and names the user's argument, never an
internal op or parameter, never another exception."""

import math
import re
import sys

import pytest
import torch

import warpbridge as wb

Q, R = torch.rand(6, 3), torch.rand(20, 3)
F = torch.rand(20, 2)
BATCH_Q, BATCH_R = torch.tensor([0, 0, 0, 1, 1, 1]), torch.tensor([0] * 10 + [1] * 10)

# op -> its valid arguments by name
OPS = {
    "knn": dict(query=Q, ref=R, k=3, query_batch=None, ref_batch=None),
    "knn_aggregate": dict(query=Q, ref=R, features=F, k=3, sigma=0.1, query_batch=None, ref_batch=None),
    "radius_aggregate": dict(query=Q, ref=R, features=F, radius=0.3, sigma=0.1, query_batch=None, ref_batch=None),
    "radius": dict(query=Q, ref=R, radius=0.3, query_batch=None, ref_batch=None, max_neighbors=None, loop=True),
    "radius_graph": dict(x=R, r=0.3, batch=None, loop=False, max_neighbors=None),
    "knn_graph": dict(x=R, k=3, batch=None, loop=False),
}
POSITIONAL = {"knn": 3, "knn_aggregate": 5, "radius_aggregate": 5, "radius": 3, "radius_graph": 2, "knn_graph": 2}

POINTS = ["points", torch.rand(6), torch.rand(6, 4097), torch.rand(6, 3).to(torch.int32), torch.rand(6, 3, 2), 3.0]
INTS = [2**31, sys.maxsize, -(2**31) - 1, -1, 0, 2.5, True, "3", None, math.nan]
FLOATS = [-1.0, 0.0, math.nan, math.inf, -math.inf, 1e300, "0.3", None, True, 2**70]
BATCHES = [
    torch.tensor([1, 0, 0, 0, 0, 0]),
    torch.zeros(5, dtype=torch.int64),
    torch.rand(6),
    "0",
    -torch.ones(6, dtype=torch.int64),
]
BOOLS = [1, 0, "yes", None, 2.0]
KINDS = {
    "query": POINTS, "ref": POINTS, "x": POINTS, "features": POINTS[:3] + [torch.rand(19, 2), torch.rand(20, 2, 2)],
    "k": INTS, "max_neighbors": INTS, "radius": FLOATS, "r": FLOATS, "sigma": FLOATS,
    "query_batch": BATCHES, "ref_batch": BATCHES, "batch": BATCHES, "loop": BOOLS,
}  # fmt: skip

# names that belong to warpbridge's inside, not to the user's call
INTERNAL = re.compile(
    r"radius_count|radius_list|_launches|'cap'|'skip_self'|'listed'|'n_pairs'|'queries'|'order'|_\dd\b"
)


def calls():
    for op, good in OPS.items():
        for arg in good:
            for value in KINDS[arg]:
                yield op, arg, value


def call(op, args):
    names = list(args)
    positional = [args[n] for n in names[: POSITIONAL[op]]]
    keywords = {n: args[n] for n in names[POSITIONAL[op] :]}
    if op in ("knn", "knn_aggregate", "radius_aggregate"):  # batches there are keywords too
        keywords = {n: v for n, v in keywords.items() if v is not None}
    return getattr(wb.ops, op)(*positional, **keywords)


@pytest.mark.parametrize(("op", "arg", "value"), list(calls()), ids=lambda v: repr(v)[:20])
def test_a_bad_argument_is_named_in_the_public_ops_terms(op, arg, value):
    args = dict(OPS[op])
    args[arg] = value
    if arg in ("query_batch", "ref_batch", "batch") and value is not None:
        other = {"query_batch": "ref_batch", "ref_batch": "query_batch"}.get(arg)
        if other:
            args[other] = BATCH_R if other == "ref_batch" else BATCH_Q
    try:
        call(op, args)
    except wb.WarpBridgeError as e:
        message = str(e)
        assert message.startswith(f"{op}(): "), message
        assert not INTERNAL.search(message), message
        return
    # accepted: then it was a valid value (a cap no row reaches is no cap; 1e300 is a radius;
    # a graph's k past the cloud gives the edges that exist)
    whole = isinstance(value, int) and not isinstance(value, bool) and value > 0
    assert (
        (arg, value) in ACCEPTED
        or (arg == "max_neighbors" and (value is None or whole))
        or (op == "knn_graph" and arg == "k" and whole)
    )


ACCEPTED = {("radius", 1e300), ("r", 1e300), ("sigma", 1e300), ("radius", 2**70), ("r", 2**70), ("sigma", 2**70),
            ("radius", math.inf), ("r", math.inf)}  # fmt: skip
