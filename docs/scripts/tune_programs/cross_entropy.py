"""Label-smoothed cross-entropy (smoothing 0.1, mean over rows) of n x 80 logits and int64 targets, as
``torch.nn.functional.cross_entropy(x, t, label_smoothing=0.1)`` computes it
(``tailjit tune --program docs/scripts/tune_programs/cross_entropy.py --sizes n=20000``)."""

from tailjit import te

SMOOTHING = 0.1
C = 80
n = te.var("n")
x = te.placeholder((n, C), name="x")
t = te.placeholder((n,), dtype="int64", name="t")
k = te.reduce_axis((0, C), name="k")
row_max = te.compute((n,), lambda i: te.max(x[i, k], axis=k), name="row_max")
k2 = te.reduce_axis((0, C), name="k2")
log_total = te.compute((n,), lambda i: te.log(te.sum(te.exp(x[i, k2] - row_max[i]), axis=k2)), name="log_total")
k3 = te.reduce_axis((0, C), name="k3")
row_sum = te.compute((n,), lambda i: te.sum(x[i, k3], axis=k3), name="row_sum")
# -log p[i, j] = row_max[i] + log_total[i] - x[i, j]
loss = te.compute(
    (n,),
    lambda i: row_max[i] + log_total[i] - (1 - SMOOTHING) * x[i, t[i]] - SMOOTHING / C * row_sum[i],
    name="row_loss",
)
r = te.reduce_axis((0, n), name="r")
mean = te.compute((), lambda: te.sum(loss[r], axis=r) / n, name="loss")
outputs, inputs = [mean], [x, t]
