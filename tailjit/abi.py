"""The C interface between a generated kernel module and the runtime module (:mod:`tailjit.runtime.capi`):
the helper table's layout, the kernels' side of it, a kernel module's ``init`` and the error bits a
kernel returns.  The code generator emits it and the runtime implements it; it sits below both, so the
emitter never imports the runtime."""

#: The table's layout, shared by the runtime and the kernels' prelude; ``size`` guards a mismatch.
API_STRUCT = r"""
/* A kernel over the rows [lo, hi) of its first loop (the generated kern_*). */
typedef int (*tj_kernel_fn)(void **b, const int64_t *S, const int64_t *P, int64_t lo, int64_t hi);

/* A program's tensor argument or output, as its entry point checks it: its name in messages
   ("t34"), its phrase in tj_arg's ("input 'in0'", "out 't34'"), dtype (TJ_dtype_names), rank, and
   for an input the layout its kernels take (TJ_DENSE, or TJ_ROWS: rows at any stride). */
typedef struct tj_tensor_desc {
  const char *name, *label;
  int dtype, ndim, layout;
} tj_tensor_desc;
#define TJ_DENSE 0
#define TJ_ROWS 1

/* A compiled program, as the runtime's entry point (tj_api.run) runs it.  ``sizes`` is the program's
   own size logic: from the inputs' shapes and strides (flat, input after input) it fills the size
   variables ``S``, checks the shapes against each other (an exception set, -1 returned), and computes
   the outputs' dimensions (flat), the temporaries' element counts and the elements written (``work``).
   ``nshape`` and ``ndims`` are the inputs' and the outputs' ranks summed.  ``body`` runs the kernels and
   returns their error bits (``capi.ERRORS``). */
typedef struct tj_graph {
  const char *kernel, *signature;
  int nin, nout, ntemp, nsizes, nshape, ndims;
  const tj_tensor_desc *inputs, *outputs;
  const size_t *temp_item;
  int (*sizes)(const int64_t *shp, const int64_t *st, int64_t *S, int64_t *dims, size_t *temp, double *work);
  int (*body)(void **b, const int64_t *S);
  PyObject **fallback; /* the Python path for what the entry point does not take */
  void **scratch;      /* the temporaries' blocks, kept between calls */
} tj_graph;

typedef struct tj_api {
  size_t size; /* sizeof(tj_api) of the runtime that filled it */
  int (*parallel)(tj_kernel_fn fn, void **b, const int64_t *S, const int64_t *P, int64_t ext);
  PyObject *(*run)(const tj_graph *g, PyObject *const *args, size_t nargsf, PyObject *kwnames, int autograd);
} tj_api;
#define TJ_API_CAPSULE "tailjit.runtime.api"
"""

#: The bits a kernel sets in its error word, and the exception its entry point raises for each.
ERRORS = (
    (1, "IndexError", "an index computed from input data is out of bounds"),
    (2, "ZeroDivisionError", "integer division or modulo by zero"),
    (4, "ValueError", "argmax/argmin over an empty range"),
    (8, "MemoryError", "out of memory for a row buffer"),
)
ERR_INDEX, ERR_ZERODIV, ERR_EMPTY, ERR_NOMEM = (bit for bit, _, _ in ERRORS)

#: The kernels' side (part of the prelude): the table and the helpers' names.  ``TJ_api`` is one variable
#: of the module (defined beside its method table), declared here, so that a module compiled as two
#: translation units (``compiler.split_units``) reads it in both.
KERNEL_SIDE = r"""
extern __attribute__((visibility("hidden"))) const tj_api *TJ_api;
#define tj_parallel (TJ_api->parallel)
#define tj_run (TJ_api->run)
"""

#: A kernel module's ``init``: it receives the table (part of the module's definition, not the prelude,
#: which a unit of kernels alone includes without Python's headers).
MODULE_INIT = r"""
static PyObject *tj_init(PyObject *self, PyObject *api) {
  if (!PyCapsule_IsValid(api, TJ_API_CAPSULE)) {
    PyErr_SetString(PyExc_TypeError, "tailjit: a kernel's init takes the runtime's helper table");
    return NULL;
  }
  const tj_api *t = (const tj_api *)PyCapsule_GetPointer(api, TJ_API_CAPSULE);
  if (t->size != sizeof(tj_api)) {
    PyErr_SetString(PyExc_ImportError, "tailjit: a kernel and its runtime disagree on the helper table");
    return NULL;
  }
  TJ_api = t;
  Py_RETURN_NONE;
}
"""
