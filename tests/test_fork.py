"""Kernels in a forked child: OpenMP's threads do not survive fork, so the child runs them on one thread."""

import os
import subprocess
import sys
import textwrap

import pytest

# Run in a process of its own (pytest must not fork itself): a parallel kernel, then a fork, then the same
# kernel in the child, which the alarm kills if it hangs.
SCRIPT = textwrap.dedent(
    """
    import os, signal, warnings
    import numpy as np, torch, tailjit
    from tailjit import te

    def build():
        n, m = te.var("n"), te.var("m")
        x = te.placeholder((n, m), name="x")
        y = te.compute((n, m), lambda i, j: te.exp(x[i, j]) * 3 - x[i, j] / 7, name="fork_probe")
        return tailjit.build(y, [x])

    a = torch.randn(512, 1024)  # far above the parallel work threshold
    want = np.exp(a.numpy()) * 3 - a.numpy() / 7
    if BUILT_FIRST:  # the parent runs it in parallel, with the runtime loaded
        f = build()
        want = f(a).numpy().copy()
    pid = os.fork()
    if pid == 0:
        signal.alarm(20)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            f = f if BUILT_FIRST else build()  # else the child loads the runtime itself
            # numpy compares: torch's own parallel ops would hang in the child too
            same = [np.allclose(f(a).numpy(), want, rtol=1e-6) for _ in range(2)]
        told = [str(w.message) for w in caught if w.category is RuntimeWarning and "forked" in str(w.message)]
        print("child", all(same), len(told), flush=True)
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    print("status", os.waitstatus_to_exitcode(status), flush=True)
    """
)


@pytest.mark.parametrize("built_first", [True, False])
def test_a_parallel_kernel_runs_on_one_thread_in_a_forked_child_with_one_warning(built_first):
    env = {**os.environ, "OMP_NUM_THREADS": "2"}  # (a one-core machine would never run it in parallel)
    script = f"BUILT_FIRST = {built_first}\n{SCRIPT}"
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.split("\n")
    # a child killed by its alarm (-14) hung in libgomp
    assert "status 0" in lines, done.stdout + done.stderr
    assert "child True 1" in lines, done.stdout + done.stderr
