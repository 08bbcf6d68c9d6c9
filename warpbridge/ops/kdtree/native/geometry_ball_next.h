
NORM_OF
LEAF_STEPS
int leaf = at[0], t = at[1], e = at[2];
BALL_SCAN
