
NORM_OF
LEAF_STEPS
int leaf = first_leaf(), t = start_of(leaf), e = start_of(leaf + 1);
BALL_SCAN
