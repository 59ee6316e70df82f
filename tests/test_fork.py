"""Kernels in a forked child: OpenMP's threads do not survive fork, so the child runs them on one thread."""

import os
import subprocess
import sys
import textwrap

# Run in a process of its own (pytest must not fork itself): a parallel kernel, then a fork, then the same
# kernel in the child, which the alarm kills if it hangs.
SCRIPT = textwrap.dedent(
    """
    import os, signal, warnings
    import numpy as np, torch, tailjit
    from tailjit import te

    n, m = te.var("n"), te.var("m")
    x = te.placeholder((n, m), name="x")
    f = tailjit.build(te.compute((n, m), lambda i, j: te.exp(x[i, j]) * 3 - x[i, j] / 7, name="fork_probe"), [x])
    a = torch.randn(512, 1024)  # far above the parallel work threshold
    want = f(a).numpy().copy()
    pid = os.fork()
    if pid == 0:
        signal.alarm(20)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            # numpy compares: torch's own parallel ops would hang in the child too
            same = [np.array_equal(f(a).numpy(), want) for _ in range(2)]
        told = [str(w.message) for w in caught if w.category is RuntimeWarning and "forked" in str(w.message)]
        print("child", all(same), len(told), flush=True)
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    print("status", os.waitstatus_to_exitcode(status), flush=True)
    """
)


def test_a_parallel_kernel_runs_on_one_thread_in_a_forked_child_with_one_warning():
    env = {**os.environ, "OMP_NUM_THREADS": "2"}  # (a one-core machine would never run it in parallel)
    done = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.split("\n")
    # a child killed by its alarm (-14) hung in libgomp
    assert "status 0" in lines, done.stdout + done.stderr
    assert "child True 1" in lines, done.stdout + done.stderr
