"""The C runtime that every generated extension shares, built once per toolchain.

A program's entry point does the same work for every program: it reads the tensor arguments, allocates
the outputs and temporaries, releases the GIL, runs the kernels and turns their error bits into
exceptions.  That work lives here (``tj_run``, with its helpers ``tj_arg``, ``tj_new``,
``tj_requires_grad``), in one extension module built beside the precompiled prelude (``<cache>/pch``),
which also holds the torch objects and C shim entry points of :mod:`tailjit.runtime.objects`.  A
generated unit holds only what differs: its size logic, its kernel calls and their description (a
``tj_graph``).  Compiled into every unit, the helpers cost gcc about 0.08 s per unit, half of a small
kernel's compile, and a generated entry function doing the work at -O0 about 15 ms more.  The module
exports ``tj_run`` and ``tj_parallel`` as a table of function pointers in a capsule
(CPython's way for one extension to offer C functions to another).  Each kernel module receives the
capsule in its ``init`` and calls through the table: one indirect call per helper, no linker paths.
The table's layout, which the code generator emits too, is in :mod:`tailjit.abi`; the module is built and
loaded by :func:`tailjit.runtime.compiler.runtime`.
"""

from __future__ import annotations

from tailjit.abi import API_STRUCT, ERRORS

#: Warned (RuntimeWarning) in a forked process the first time a kernel runs on one thread that would have
#: run on several: OpenMP's threads do not survive ``fork``.
FORK_WARNING = (
    "tailjit: this process was forked from one that may have started OpenMP threads, which do not survive "
    "a fork, so its kernels run on one thread; start worker processes with the 'spawn' or 'forkserver' "
    "method (multiprocessing.set_start_method) to run them in parallel"
)

#: The runtime module; ``TJ_MODULE_NAME`` is replaced by its name.
RUNTIME_SOURCE = (
    r"""
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <omp.h>
"""
    + API_STRUCT
    + r"""
/* Runtime objects handed over by tailjit.runtime.objects at load time. */
static PyTypeObject *TJ_Tensor, *TJ_Parameter;
static PyObject *TJ_dtypes[5], *TJ_strided, *TJ_empty;
static PyObject *s_dtype, *s_is_cpu, *s_layout, *s_shape, *s_stride, *s_is_nested, *s_is_zerotensor, *s_is_neg;
static void *(*tj_data_ptr)(PyObject *);
typedef int32_t (*tj_get_i64_fn)(void *, int64_t *);
typedef int32_t (*tj_get_ptr_fn)(void *, int64_t **);
typedef int32_t (*tj_get_i32_fn)(void *, int32_t *);
static int32_t (*tj_empty_strided)(int64_t, const int64_t *, const int64_t *, int32_t, int32_t, int32_t, void **);
static int32_t (*tj_get_data_ptr)(void *, void **);
static int32_t (*tj_delete)(void *);
static tj_get_i64_fn tj_get_dim;
static tj_get_ptr_fn tj_get_sizes, tj_get_strides;
static tj_get_i32_fn tj_get_dtype, tj_get_device, tj_get_layout;
static PyObject *(*tj_wrap)(void *);
static int TJ_raw; /* THPVariable layout verified: read metadata through the C shim */
static bool (*tj_grad_mode)(void); /* aoti_torch_grad_mode_is_enabled, or NULL */
static int64_t TJ_meta_off = -1; /* offset of TensorImpl::autograd_meta_ (verified), or -1 */
static int64_t TJ_keys_off = -1; /* offset of TensorImpl::key_set_ (verified), or -1 */
static uint64_t TJ_keys_ok;      /* the keys a plain dense CPU tensor may carry */
static PyObject *s_requires_grad;
static int32_t TJ_codes[5], TJ_cpu, TJ_strided_code;
static const char *TJ_dtype_names[5] = {"bool", "int32", "int64", "float32", "float64"};
static int TJ_huge_pages = 1; /* see tj_huge_pages */

static PyObject *rt_init(PyObject *self, PyObject *rt) {
  PyObject *objs, *addrs, *codes;
  if (!PyArg_ParseTuple(rt, "O!O!O!", &PyTuple_Type, &objs, &PyTuple_Type, &addrs, &PyTuple_Type, &codes))
    return NULL;
  TJ_Tensor = (PyTypeObject *)PyTuple_GetItem(objs, 0);
  TJ_Parameter = (PyTypeObject *)PyTuple_GetItem(objs, 1);
  for (int i = 0; i < 5; i++) TJ_dtypes[i] = PyTuple_GetItem(PyTuple_GetItem(objs, 2), i);
  TJ_strided = PyTuple_GetItem(objs, 3);
  TJ_empty = PyTuple_GetItem(objs, 4);
  tj_data_ptr = (void *(*)(PyObject *))PyLong_AsVoidPtr(PyTuple_GetItem(objs, 5));
  Py_INCREF(objs); /* keeps every object above alive */
  void *a[12];
  for (int i = 0; i < 12; i++) a[i] = PyLong_AsVoidPtr(PyTuple_GetItem(addrs, i));
  tj_empty_strided = a[0]; tj_get_data_ptr = a[1]; tj_delete = a[2]; tj_get_dim = a[3];
  tj_get_sizes = a[4]; tj_get_strides = a[5]; tj_get_dtype = a[6]; tj_get_device = a[7];
  tj_get_layout = a[8]; tj_wrap = a[9]; TJ_raw = a[10] != NULL; tj_grad_mode = (bool (*)(void))a[11];
  for (int i = 0; i < 5; i++) TJ_codes[i] = (int32_t)PyLong_AsLong(PyTuple_GetItem(codes, i));
  TJ_cpu = (int32_t)PyLong_AsLong(PyTuple_GetItem(codes, 5));
  TJ_strided_code = (int32_t)PyLong_AsLong(PyTuple_GetItem(codes, 6));
  TJ_meta_off = (int64_t)PyLong_AsLongLong(PyTuple_GetItem(codes, 8));
  TJ_keys_off = (int64_t)PyLong_AsLongLong(PyTuple_GetItem(codes, 9));
  TJ_keys_ok = (uint64_t)PyLong_AsUnsignedLongLong(PyTuple_GetItem(codes, 10));
  if (PyErr_Occurred()) return NULL;
  s_dtype = PyUnicode_InternFromString("dtype");
  s_is_cpu = PyUnicode_InternFromString("is_cpu");
  s_layout = PyUnicode_InternFromString("layout");
  s_shape = PyUnicode_InternFromString("shape");
  s_stride = PyUnicode_InternFromString("stride");
  s_is_nested = PyUnicode_InternFromString("is_nested");
  s_is_zerotensor = PyUnicode_InternFromString("_is_zerotensor");
  s_is_neg = PyUnicode_InternFromString("is_neg");
  s_requires_grad = PyUnicode_InternFromString("requires_grad");
  const char *huge = getenv("TAILJIT_HUGE_PAGES");
  TJ_huge_pages = !(huge && strcmp(huge, "0") == 0);
  Py_RETURN_NONE;
}

/* A tensor with elements but no memory: a fake tensor, or one inside functionalize or vmap. */
static int tj_no_data(void *ptr, int ndim, const int64_t *shape) {
  if (ptr) return 0;
  for (int d = 0; d < ndim; d++)
    if (shape[d] == 0) return 0;
  return 1;
}

/* The fast path: metadata through the C shim; 0 when anything is off (the
   attribute path below then reports it precisely). */
static int tj_arg_raw(PyObject *o, int dt, int ndim, void **ptr, int64_t *shape, int64_t *stride) {
  void *h = (char *)o + sizeof(PyObject);
  int32_t v;
  int64_t nd, *p;
  if (TJ_keys_off < 0) return 0; /* a negative view cannot be told apart from its keys */
  const char *impl = *(const char *const *)h;
  if (*(const uint64_t *)(impl + TJ_keys_off) & ~TJ_keys_ok) return 0;
  if (tj_get_dtype(h, &v) || v != TJ_codes[dt]) return 0;
  if (tj_get_device(h, &v) || v != TJ_cpu) return 0;
  if (tj_get_layout(h, &v) || v != TJ_strided_code) return 0;
  if (tj_get_dim(h, &nd) || nd != ndim) return 0;
  if (tj_get_sizes(h, &p)) return 0;
  for (int d = 0; d < ndim; d++) shape[d] = p[d];
  if (tj_get_strides(h, &p)) return 0;
  for (int d = 0; d < ndim; d++) stride[d] = p[d];
  return tj_get_data_ptr(h, ptr) == 0 && !tj_no_data(*ptr, ndim, shape);
}

/* A tensor's boolean attribute ``name`` (``call``: its method), or -1 with an error set. */
static int tj_flag(PyObject *o, PyObject *name, int call) {
  PyObject *v = call ? PyObject_CallMethodNoArgs(o, name) : PyObject_GetAttr(o, name);
  if (!v) return -1;
  Py_DECREF(v);
  return v == Py_True;
}

/* Read one tensor argument: 1 = not a plain torch.Tensor, or a negative view (the Python
   wrapper handles numpy and friends, and resolves it), -1 = error set, 0 = ok. */
static int tj_arg(PyObject *o, const char *kernel, const char *name, int dt, int ndim, void **ptr,
                  int64_t *shape, int64_t *stride) {
  PyTypeObject *tp = Py_TYPE(o);
  if (tp != TJ_Tensor && tp != TJ_Parameter) return 1;
  if (TJ_raw && tj_arg_raw(o, dt, ndim, ptr, shape, stride)) return 0;
  PyObject *v = PyObject_GetAttr(o, s_dtype);
  if (!v) return -1;
  Py_DECREF(v);
  if (v != TJ_dtypes[dt]) {
    PyErr_Format(PyExc_TypeError, "tailjit kernel '%s': %s must have dtype %s, got %S", kernel, name,
                 TJ_dtype_names[dt], v);
    return -1;
  }
  v = PyObject_GetAttr(o, s_is_cpu);
  if (!v) return -1;
  Py_DECREF(v);
  if (v != Py_True) {
    PyErr_Format(PyExc_ValueError, "tailjit kernel '%s': %s must be a CPU tensor (tailjit compiles for the CPU)",
                 kernel, name);
    return -1;
  }
  v = PyObject_GetAttr(o, s_layout);
  if (!v) return -1;
  Py_DECREF(v);
  if (v != TJ_strided) {
    PyErr_Format(PyExc_ValueError, "tailjit kernel '%s': %s must be a dense (strided) tensor, got layout %S",
                 kernel, name, v);
    return -1;
  }
  /* not plain memory of its values: a negative view (the Python side resolves it), a nested or a zero tensor */
  int nested = tj_flag(o, s_is_nested, 0), zero = nested ? 0 : tj_flag(o, s_is_zerotensor, 1);
  if (nested < 0 || zero < 0) return -1;
  if (nested || zero) {
    PyErr_Format(PyExc_ValueError, "tailjit kernel '%s': %s must be a dense (strided) tensor, got a %s tensor",
                 kernel, name, nested ? "nested" : "zero (torch._efficientzerotensor)");
    return -1;
  }
  int neg = tj_flag(o, s_is_neg, 1);
  if (neg) return neg;
  PyObject *sh = PyObject_GetAttr(o, s_shape);
  if (!sh) return -1;
  if (PyTuple_GET_SIZE(sh) != ndim) {
    PyErr_Format(PyExc_ValueError, "tailjit kernel '%s': %s must have %d dimension(s), got %zd (shape %S)",
                 kernel, name, ndim, PyTuple_GET_SIZE(sh), sh);
    Py_DECREF(sh);
    return -1;
  }
  for (int d = 0; d < ndim; d++) shape[d] = PyLong_AsLongLong(PyTuple_GET_ITEM(sh, d));
  Py_DECREF(sh);
  PyObject *st = PyObject_CallMethodNoArgs(o, s_stride);
  if (!st) return -1;
  for (int d = 0; d < ndim; d++) stride[d] = PyLong_AsLongLong(PyTuple_GET_ITEM(st, d));
  Py_DECREF(st);
  if (TJ_raw) {  /* the shim reports a tensor without storage (vmap's) as an error, not a C++ throw */
    if (tj_get_data_ptr((char *)o + sizeof(PyObject), ptr)) *ptr = NULL;
  } else {
    PyObject *addr = PyObject_CallMethod(o, "data_ptr", NULL);
    if (!addr) return -1;
    *ptr = PyLong_AsVoidPtr(addr);
    Py_DECREF(addr);
  }
  if (tj_no_data(*ptr, ndim, shape)) {
    PyErr_Format(PyExc_TypeError,
                 "tailjit kernel '%s': %s holds no data (a fake or meta tensor, or one inside a torch.func "
                 "transform); call kernels on real tensors, or make the function a @tailjit.op, which traces",
                 kernel, name);
    return -1;
  }
  return 0;
}

/* Transparent huge pages for a large output: the kernel's first writes then fault once per 2 MiB instead
   of once per 4 KiB page.  An output of TJ_HUGE_MIN or more is fresh memory from mmap on every call
   (glibc's mmap threshold grows with the blocks freed, up to 32 MiB), and those faults were half of a
   memory-bound kernel's time (a 64 MiB masked multiply: 49000 faults, 35 ms; with huge pages 13 ms).  A
   smaller one comes back from the heap, already faulted in, from the second call on; advising it saved
   nothing there and sometimes stalled the first call 5-15 ms on the measuring VM (pairwise IoU's 8 MiB
   output: 4 first calls of 19).  Only the 2 MiB-aligned part is advised; TAILJIT_HUGE_PAGES=0 turns it
   off (read by rt_init). */
#define TJ_HUGE_MIN ((int64_t)32 << 20)
static void tj_huge_pages(void *p, int64_t numel, int dt) {
#ifdef MADV_HUGEPAGE
  static const int64_t item[5] = {1, 4, 8, 4, 8}; /* TJ_dtype_names */
  const uintptr_t huge = (uintptr_t)2 << 20;
  if (!TJ_huge_pages || numel <= 0 || numel * item[dt] < TJ_HUGE_MIN) return;
  uintptr_t lo = ((uintptr_t)p + huge - 1) & ~(huge - 1), hi = ((uintptr_t)p + numel * item[dt]) & ~(huge - 1);
  if (hi > lo) madvise((void *)lo, hi - lo, MADV_HUGEPAGE); /* advice: a failure changes nothing */
#endif
}

/* A new contiguous CPU tensor; through torch's C shim when available. */
static PyObject *tj_new(int ndim, const int64_t *sizes, int dt, void **data) {
  int64_t strides[ndim > 0 ? ndim : 1];
  int64_t s = 1, numel = 1;
  int big = 0; /* torch checks the bytes too; the element count and strides are ours to compute */
  for (int d = ndim - 1; d >= 0; d--) {
    strides[d] = s;
    big |= __builtin_mul_overflow(s, sizes[d] > 1 ? sizes[d] : 1, &s) | __builtin_mul_overflow(numel, sizes[d], &numel);
  }
  if (big) {
    PyErr_SetString(PyExc_MemoryError, "tailjit: an output tensor's size overflows 64 bits");
    return NULL;
  }
  if (tj_empty_strided && tj_wrap) {
    void *h = NULL;
    if (tj_empty_strided(ndim, sizes, strides, TJ_codes[dt], TJ_cpu, 0, &h) != 0 || !h) {
      PyErr_SetString(PyExc_MemoryError, "tailjit: could not allocate an output tensor");
      return NULL;
    }
    PyObject *o = tj_wrap(h);
    tj_get_data_ptr(h, data);
    tj_delete(h);
    tj_huge_pages(*data, numel, dt);
    return o;
  }
  PyObject *shape = PyTuple_New(ndim);
  if (!shape) return NULL;
  for (int d = 0; d < ndim; d++) PyTuple_SET_ITEM(shape, d, PyLong_FromLongLong(sizes[d]));
  PyObject *kw = Py_BuildValue("{sO}", "dtype", TJ_dtypes[dt]);
  PyObject *args = PyTuple_Pack(1, shape);
  PyObject *o = (kw && args) ? PyObject_Call(TJ_empty, args, kw) : NULL;
  Py_DECREF(shape); Py_XDECREF(kw); Py_XDECREF(args);
  if (o) {
    *data = tj_data_ptr(o);
    tj_huge_pages(*data, numel, dt);
  }
  return o;
}

/* 1 when a tensor argument takes part in autograd: grad mode is on and it
   requires grad.  A tensor without autograd metadata, the usual case outside
   training, is answered from its TensorImpl with two loads; the others ask
   torch's grad mode, then requires_grad. */
static int tj_requires_grad(PyObject *o) {
  PyTypeObject *tp = Py_TYPE(o);
  if (tp != TJ_Tensor && tp != TJ_Parameter) return 0; /* the Python side handles other objects */
  if (TJ_meta_off >= 0) {
    const char *impl = *(const char *const *)((const char *)o + sizeof(PyObject));
    if (*(void *const *)(impl + TJ_meta_off) == NULL) return 0;
  }
  if (tj_grad_mode && !tj_grad_mode()) return 0;
  PyObject *v = PyObject_GetAttr(o, s_requires_grad);
  if (!v) { PyErr_Clear(); return 1; }
  Py_DECREF(v);
  return v == Py_True;
}


/* In a process forked from one that may have started OpenMP's threads (``rt_forked``): they did not
   survive the fork, and libgomp's next parallel region waits for them for ever, so kernels run on this
   thread.  TJ_FORKED until a kernel does, then TJ_FORK_WARN until ``tj_run`` has warned, then TJ_FORK_TOLD. */
#define TJ_FORK_MESSAGE """
    + f'"{FORK_WARNING}"'
    + r"""
#define TJ_FORKED 1
#define TJ_FORK_WARN 2
#define TJ_FORK_TOLD 3
static int tj_forked;

/* ``fn`` over [0, ext) shared among OpenMP's threads in equal parts.  One parallel region for every
   kernel: gcc outlines a region into a function of its own, about 4 ms of compile per kernel when each
   kernel had its own. */
static int tj_parallel(tj_kernel_fn fn, void **b, const int64_t *S, const int64_t *P, int64_t ext) {
  if (__atomic_load_n(&tj_forked, __ATOMIC_RELAXED)) {
    int was = TJ_FORKED;
    __atomic_compare_exchange_n(&tj_forked, &was, TJ_FORK_WARN, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED);
    return fn(b, S, P, 0, ext);
  }
  int err = 0;
#pragma omp parallel reduction(|:err)
  {
    const int64_t nt = omp_get_num_threads(), tid = omp_get_thread_num();
    err |= fn(b, S, P, ext * tid / nt, ext * (tid + 1) / nt);
  }
  return err;
}

/* A temporary's buffer is kept for the next call, one block per temporary (the
   latest, grown as needed): a fresh block of megabytes costs page faults on every
   call (64 MB: about 35 ms on the measuring VM, against 4 ms to fill it again).
   Taking and giving back swap the block out of and into its slot atomically, so
   that calls running at once on threads without the GIL each get a block of their
   own. The data starts TJ_BLOCK_HEAD bytes into a block, after its capacity. */
#define TJ_BLOCK_HEAD 64
static void *tj_scratch_take(void **slot, size_t bytes) {
  char *blk = __atomic_exchange_n((char **)slot, NULL, __ATOMIC_ACQ_REL);
  if (blk && *(size_t *)blk >= bytes) return blk + TJ_BLOCK_HEAD;
  free(blk);
  blk = bytes > SIZE_MAX - TJ_BLOCK_HEAD ? NULL : malloc(TJ_BLOCK_HEAD + bytes);
  if (!blk) return NULL;
  *(size_t *)blk = bytes;
  return blk + TJ_BLOCK_HEAD;
}
static void tj_scratch_give(void **slot, void *data) {
  if (data) free(__atomic_exchange_n((char **)slot, (char *)data - TJ_BLOCK_HEAD, __ATOMIC_ACQ_REL));
}

/* Whether a tensor's last dimension is contiguous (its other strides are passed to the kernels); any
   layout of an empty tensor will do, as for tj_dense. */
static int tj_rows(int ndim, const int64_t *shape, const int64_t *stride) {
  for (int d = 0; d < ndim; d++)
    if (shape[d] == 0) return 1;
  return shape[ndim - 1] == 1 || stride[ndim - 1] == 1;
}

/* Whether a tensor is contiguous, as torch's is_contiguous says: the strides of
   size-1 dimensions, and any stride of an empty tensor, do not matter. */
static int tj_dense(int ndim, const int64_t *shape, const int64_t *stride) {
  for (int d = 0; d < ndim; d++)
    if (shape[d] == 0) return 1;
  int64_t expect = 1;
  for (int d = ndim - 1; d >= 0; d--) {
    if (shape[d] != 1 && stride[d] != expect) return 0;
    expect *= shape[d];
  }
  return 1;
}

/* An output of the given dimensions: a new tensor, or (``out``, not NULL) that tensor, checked. */
static PyObject *tj_output(const tj_graph *g, const tj_tensor_desc *t, const int64_t *dims, PyObject *out,
                           void **data) {
  for (int d = 0; d < t->ndim; d++)
    if (dims[d] < 0) {
      PyErr_Format(PyExc_ValueError, "tailjit kernel '%s': output '%s' dimension %d would have negative size %lld",
                   g->kernel, t->name, d, (long long)dims[d]);
      return NULL;
    }
  if (!out) return tj_new(t->ndim, dims, t->dtype, data);
  int64_t shape[t->ndim > 0 ? t->ndim : 1], stride[t->ndim > 0 ? t->ndim : 1];
  int r = tj_arg(out, g->kernel, t->label, t->dtype, t->ndim, data, shape, stride);
  if (r) {
    if (r > 0) PyErr_SetString(PyExc_TypeError, "out must be a torch.Tensor");
    return NULL;
  }
  int64_t expect = 1;
  for (int d = t->ndim - 1; d >= 0; d--) {
    if (shape[d] != dims[d]) {
      PyErr_Format(PyExc_ValueError, "tailjit kernel '%s': out '%s' dimension %d must be %lld, got %lld", g->kernel,
                   t->name, d, (long long)dims[d], (long long)shape[d]);
      return NULL;
    }
    if (dims[d] > 1 && stride[d] != expect) {
      PyErr_SetString(PyExc_ValueError, "out must be contiguous");
      return NULL;
    }
    expect *= dims[d] > 1 ? dims[d] : 1;
  }
  return Py_NewRef(out);
}

/* A program's run on arguments already counted: 1 to take the Python path (an argument it does not
   take), else 0 with the result (NULL with an exception set) in ``*res``. */
static int tj_run_args(const tj_graph *g, PyObject *const *args, Py_ssize_t nargs, PyObject **res) {
  const int nin = g->nin, nout = g->nout, ntemp = g->ntemp;
  void *b[nin + nout + ntemp + 1];
  int64_t S[g->nsizes + 1], shp[g->nshape + 1], st[g->nshape + 1], dims[g->ndims + 1];
  size_t temp[ntemp + 1];
  PyObject *outs[nout + 1];
  memset(b, 0, sizeof b);
  memset(S, 0, sizeof S);
  memset(outs, 0, sizeof outs);
  double work = 0;
  for (int i = 0, at = 0; i < nin; at += g->inputs[i].ndim, i++) {
    const tj_tensor_desc *t = &g->inputs[i];
    int r = tj_arg(args[i], g->kernel, t->label, t->dtype, t->ndim, &b[i], &shp[at], &st[at]);
    if (r || !(t->layout == TJ_ROWS ? tj_rows : tj_dense)(t->ndim, &shp[at], &st[at])) {
      *res = NULL;
      return r >= 0; /* the Python side copies an input of another layout */
    }
  }
  *res = NULL;
  if (g->sizes(shp, st, S, dims, temp, &work)) return 0;
  for (int j = 0, at = 0; j < nout; at += g->outputs[j].ndim, j++) {
    outs[j] = tj_output(g, &g->outputs[j], &dims[at], nargs == nin ? NULL : args[nin + j], &b[nin + j]);
    if (!outs[j]) goto fail;
  }
  for (int j = 0; j < ntemp; j++) {
    size_t bytes; /* a count that wraps would give a small block the kernels overrun */
    int big = __builtin_mul_overflow(temp[j], g->temp_item[j], &bytes) || __builtin_add_overflow(bytes, 1, &bytes);
    if (big) {
      PyErr_Format(PyExc_MemoryError, "tailjit kernel '%s': a temporary of %zu elements of %zu bytes is too large",
                   g->kernel, temp[j], g->temp_item[j]);
      goto fail;
    }
    b[nin + nout + j] = tj_scratch_take(&g->scratch[j], bytes);
    if (!b[nin + nout + j]) {
      PyErr_NoMemory();
      goto fail;
    }
  }
  /* release the GIL only where the work dwarfs the cost of releasing it */
  PyThreadState *ts = work > 32768.0 ? PyEval_SaveThread() : NULL;
  int err = g->body(b, S);
  if (ts) PyEval_RestoreThread(ts);
  for (int j = 0; j < ntemp; j++) {
    tj_scratch_give(&g->scratch[j], b[nin + nout + j]);
    b[nin + nout + j] = NULL;
  }
  int warn = TJ_FORK_WARN; /* once per process, with the GIL: a kernel ran serially for a fork */
  if (__atomic_compare_exchange_n(&tj_forked, &warn, TJ_FORK_TOLD, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED) &&
      PyErr_WarnEx(PyExc_RuntimeWarning, TJ_FORK_MESSAGE, 1))
    goto fail;
"""
    + "".join(
        f"  if (err & {bit}) {{ PyErr_Format(PyExc_{exc}, \"tailjit kernel '%s': {msg}\", g->kernel); goto fail; }}\n"
        for bit, exc, msg in ERRORS
    )
    + r"""
  if (nout == 1) {
    *res = outs[0];
    return 0;
  }
  *res = PyTuple_New(nout);
  if (!*res) goto fail;
  for (int j = 0; j < nout; j++) PyTuple_SET_ITEM(*res, j, outs[j]);
  return 0;
fail:
  for (int j = 0; j < ntemp; j++) tj_scratch_give(&g->scratch[j], b[nin + nout + j]);
  for (int j = 0; j < nout; j++) Py_XDECREF(outs[j]);
  return 0;
}

/* Every program's entry point: ``call(*inputs)``, or for the plain one also ``call(*inputs, *outs)``.
   It reads the tensor arguments, lets the program check and bind their sizes (g->sizes), allocates the
   outputs (or checks the out= tensors) and the temporaries, runs the kernels (without the GIL where they
   write more than 32768 elements) and raises for their error bits.  Keywords, other objects (numpy arrays), inputs in
   another layout, and with ``autograd`` inputs that require grad, go to the program's Python fallback. */
static PyObject *tj_run_graph(const tj_graph *g, PyObject *const *args, size_t nargsf, PyObject *kwnames,
                              int autograd) {
  Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
  if (kwnames || !*g->fallback) goto slow;
  if (autograd && nargs >= g->nin)
    for (int i = 0; i < g->nin; i++)
      if (tj_requires_grad(args[i])) goto slow;
  /* outputs follow the inputs only in the plain entry's calls from Python's out= path, which checked them;
     a caller's extra positional tensor is an error, not an output buffer (flip(v, v) overwrote v) */
  if (nargs != g->nin && (autograd || nargs != g->nin + g->nout)) {
    PyErr_Format(PyExc_TypeError, "tailjit kernel '%s' takes %d input(s) (%s), got %zd; output buffers go in out=",
                 g->kernel, g->nin, g->signature, nargs);
    return NULL;
  }
  PyObject *res;
  if (!tj_run_args(g, args, nargs, &res)) return res;
slow: /* numpy arrays, out=, other objects: the Python side */
  if (!*g->fallback) {
    PyErr_SetString(PyExc_RuntimeError, "tailjit: kernel not initialised");
    return NULL;
  }
  return PyObject_Vectorcall(*g->fallback, args, nargsf, kwnames);
}

static const tj_api TJ_table = {sizeof(tj_api), tj_parallel, tj_run_graph};

static PyObject *rt_api(PyObject *self, PyObject *unused) {
  return PyCapsule_New((void *)&TJ_table, TJ_API_CAPSULE, NULL);
}

static PyObject *rt_forked(PyObject *self, PyObject *unused) {
  int was = 0;
  __atomic_compare_exchange_n(&tj_forked, &was, TJ_FORKED, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED);
  Py_RETURN_NONE;
}

static PyMethodDef rt_methods[] = {
  {"init", rt_init, METH_VARARGS, "hand over runtime objects"},
  {"forked", rt_forked, METH_NOARGS, "this process was forked: run kernels on one thread"},
  {"api", rt_api, METH_NOARGS, "the helper table, as a capsule"},
  {NULL, NULL, 0, NULL}};
static struct PyModuleDef rt_module = {PyModuleDef_HEAD_INIT, "TJ_MODULE_NAME", NULL, -1, rt_methods};
PyMODINIT_FUNC PyInit_TJ_MODULE_NAME(void) { return PyModule_Create(&rt_module); }
"""
)
