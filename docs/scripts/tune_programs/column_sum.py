"""Column sums of an n x m matrix
(``tailjit tune --program docs/scripts/tune_programs/column_sum.py --sizes n=4096,m=1024``)."""

from tailjit import te

n, m = te.var("n"), te.var("m")
x = te.placeholder((n, m), name="x")
r = te.reduce_axis((0, n), name="r")
y = te.compute((m,), lambda j: te.sum(x[r, j], axis=r), name="column_sum")
outputs, inputs = [y], [x]
