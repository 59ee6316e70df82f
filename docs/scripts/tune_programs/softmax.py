"""Row softmax over n x 1024 (``tailjit tune --program docs/scripts/tune_programs/softmax.py --sizes n=4096``)."""

from tailjit import te

n = te.var("n")
x = te.placeholder((n, 1024), name="x")
k = te.reduce_axis((0, 1024), name="k")
row_max = te.compute((n,), lambda i: te.max(x[i, k], axis=k), name="row_max")
e = te.compute((n, 1024), lambda i, j: te.exp(x[i, j] - row_max[i]), name="e")
k2 = te.reduce_axis((0, 1024), name="k2")
total = te.compute((n,), lambda i: te.sum(e[i, k2], axis=k2), name="total")
y = te.compute((n, 1024), lambda i, j: e[i, j] / total[i], name="softmax")
outputs, inputs = [y], [x]
