// Cached launches of one kernel whose tensors and barrier counter change from call to call (the
// symmetric-memory collectives: collectives/plan.py's CachedLaunch), made from C: the call's
// data pointers and the counter's epoch and buffer offset written into a parameter block
// prepared once, and cuLaunchKernel. What the C launcher Triton generates does per call besides
// (parsing a dozen arguments, resolving every pointer with cuPointerGetAttribute) is done once,
// when the launch is made.
//
// Built by Triton's own C-module builder (the compiler Triton needs on a GPU machine), with only
// Python's headers; the driver is reached through dlopen.

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <dlfcn.h>
#include <stdint.h>
#include <string.h>
#include <structmember.h>

typedef int (*LaunchFn)(void*, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                        unsigned, void*, void**, void**);
typedef int (*CapturingFn)(void*, int*);
typedef int (*ContextFn)(void**);

static LaunchFn cu_launch;
static CapturingFn cu_capturing;
static ContextFn cu_context;
static int driver_loaded;
// Tests on machines without a GPU: a callable given (function, grid, block, shared, [cell])
// for every launch, in place of the driver (and of the context and capture checks).
static PyObject* test_launcher;
static PyObject* str_data_ptr;

static void load_driver(void) {
  if (driver_loaded) return;
  driver_loaded = 1;
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
  if (!lib) return;
  cu_launch = (LaunchFn)dlsym(lib, "cuLaunchKernel");
  cu_capturing = (CapturingFn)dlsym(lib, "cuStreamIsCapturing");
  cu_context = (ContextFn)dlsym(lib, "cuCtxGetCurrent");
  if (!cu_launch || !cu_capturing || !cu_context) cu_launch = NULL;
}

// ---- Counter: one symmetric workspace's barrier epochs and buffer halves --------------------

typedef struct {
  PyObject_HEAD
  long long epoch;  // barriers passed, modulo 2^32 (the pads start at 0)
  long long calls;  // calls made: the half a call uses alternates
  long long numel;  // elements in a half
} Counter;

// The first barrier's epoch (as an int32) and the half's element offset for the next call,
// which passes `barriers` barriers; the counter moves past the call.
static void counter_advance(Counter* c, long long barriers, long long* epoch, long long* half) {
  long long first = (c->epoch + 1) & 0xFFFFFFFFLL;
  c->epoch = (c->epoch + barriers) & 0xFFFFFFFFLL;
  *half = (c->calls & 1) * c->numel;
  c->calls += 1;
  *epoch = first >= (1LL << 31) ? first - (1LL << 32) : first;
}

static int Counter_init(Counter* self, PyObject* args, PyObject* kwargs) {
  static char* names[] = {"numel", "epoch", "calls", NULL};
  self->epoch = self->calls = 0;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "L|LL", names, &self->numel, &self->epoch,
                                   &self->calls))
    return -1;
  return 0;
}

static PyObject* Counter_advance(Counter* self, PyObject* arg) {
  long long barriers = PyLong_AsLongLong(arg);
  if (barriers == -1 && PyErr_Occurred()) return NULL;
  long long epoch, half;
  counter_advance(self, barriers, &epoch, &half);
  return Py_BuildValue("(LL)", epoch, half);
}

static PyMethodDef Counter_methods[] = {
    {"advance", (PyCFunction)Counter_advance, METH_O,
     "advance(barriers) -> (epoch, half offset) of the next call"},
    {NULL, NULL, 0, NULL}};

static PyMemberDef Counter_members[] = {
    {"epoch", T_LONGLONG, offsetof(Counter, epoch), 0, "barriers passed, modulo 2^32"},
    {"calls", T_LONGLONG, offsetof(Counter, calls), 0, "calls made"},
    {"numel", T_LONGLONG, offsetof(Counter, numel), 0, "elements in a half"},
    {NULL, 0, 0, 0, NULL}};

static PyTypeObject CounterType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "tritonkit_native_launch.Counter",
    .tp_basicsize = sizeof(Counter),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Counter_init,
    .tp_methods = Counter_methods,
    .tp_members = Counter_members,
};

// ---- Launch ----------------------------------------------------------------------------------

#define MAX_TENSORS 8

typedef struct {
  PyObject_HEAD
  void* function;  // the CUfunction
  unsigned grid[3], block, shared;
  Py_ssize_t n_params;
  uint64_t* cells;  // one 8-byte cell per parameter (little-endian: narrower kinds in the low bytes)
  void** params;  // cuLaunchKernel's array: the cells' addresses
  int n_tensors;
  int tensor_param[MAX_TENSORS];  // the parameter each tensor's data pointer goes into
  int aligned[MAX_TENSORS];  // whether it was 16-byte aligned when the kernel was specialized
  int epoch_param, offset_param;  // the parameters that take the epoch and the offset / 16
  long long barriers;
  Counter* counter;
  void* context;  // the CUcontext the function was loaded in
  PyObject* get_stream;  // device index -> the current raw stream (torch._C's)
  PyObject* device;  // the index it is called with
  long long runs;
} Launch;

static void Launch_dealloc(Launch* self) {
  PyMem_Free(self->cells);
  PyMem_Free(self->params);
  Py_XDECREF(self->counter);
  Py_XDECREF(self->get_stream);
  Py_XDECREF(self->device);
  Py_TYPE(self)->tp_free((PyObject*)self);
}

// Launch(function, grid, block, shared, cells, tensor_params, aligned, epoch_param,
//        offset_param, counter, barriers, context, get_stream, device)
static int Launch_init(Launch* self, PyObject* args, PyObject* kwargs) {
  unsigned long long function, context;
  PyObject *grid, *tensor_params, *aligned, *counter, *get_stream, *device;
  const char* cells;
  Py_ssize_t cells_len;
  if (!PyArg_ParseTuple(args, "KOIIy#OOiiOLKOO", &function, &grid, &self->block, &self->shared,
                        &cells, &cells_len, &tensor_params, &aligned, &self->epoch_param,
                        &self->offset_param, &counter, &self->barriers, &context, &get_stream,
                        &device))
    return -1;
  if (!PyObject_TypeCheck(counter, &CounterType)) {
    PyErr_SetString(PyExc_TypeError, "Launch: counter must be a Counter");
    return -1;
  }
  if (!PyTuple_Check(grid) || PyTuple_GET_SIZE(grid) != 3 || !PyTuple_Check(tensor_params) ||
      !PyTuple_Check(aligned) || PyTuple_GET_SIZE(tensor_params) != PyTuple_GET_SIZE(aligned) ||
      PyTuple_GET_SIZE(tensor_params) > MAX_TENSORS || cells_len % 8 != 0) {
    PyErr_SetString(PyExc_ValueError, "Launch: malformed grid, tensor or cell arguments");
    return -1;
  }
  self->function = (void*)(uintptr_t)function;
  self->context = (void*)(uintptr_t)context;
  for (int i = 0; i < 3; ++i) self->grid[i] = (unsigned)PyLong_AsUnsignedLong(PyTuple_GET_ITEM(grid, i));
  self->n_params = cells_len / 8;
  self->n_tensors = (int)PyTuple_GET_SIZE(tensor_params);
  for (int i = 0; i < self->n_tensors; ++i) {
    self->tensor_param[i] = (int)PyLong_AsLong(PyTuple_GET_ITEM(tensor_params, i));
    self->aligned[i] = PyObject_IsTrue(PyTuple_GET_ITEM(aligned, i));
    if (self->tensor_param[i] < 0 || self->tensor_param[i] >= self->n_params) {
      PyErr_SetString(PyExc_ValueError, "Launch: a tensor parameter out of range");
      return -1;
    }
  }
  if (self->epoch_param >= self->n_params || self->offset_param >= self->n_params) {
    PyErr_SetString(PyExc_ValueError, "Launch: a counter parameter out of range");
    return -1;
  }
  if (PyErr_Occurred()) return -1;
  PyMem_Free(self->cells);
  PyMem_Free(self->params);
  self->cells = PyMem_Malloc(cells_len > 0 ? cells_len : 8);
  self->params = PyMem_Malloc(sizeof(void*) * (self->n_params > 0 ? self->n_params : 1));
  if (!self->cells || !self->params) {
    PyErr_NoMemory();
    return -1;
  }
  memcpy(self->cells, cells, cells_len);
  for (Py_ssize_t i = 0; i < self->n_params; ++i) self->params[i] = &self->cells[i];
  Py_INCREF(counter);
  Py_XSETREF(self->counter, (Counter*)counter);
  Py_INCREF(get_stream);
  Py_XSETREF(self->get_stream, get_stream);
  Py_INCREF(device);
  Py_XSETREF(self->device, device);
  load_driver();
  return 0;
}

// run(tensors) -> bool: launch with these tensors (a tuple, as made) on the current stream, the
// counter advanced; False, having done nothing, where this launch does not apply: another
// count of tensors, a tensor of another 16-byte alignment (another specialization), another
// current context (another device), a stream being captured (the epochs would be replayed).
static PyObject* Launch_run(Launch* self, PyObject* tensors) {
  if (!PyTuple_Check(tensors) || PyTuple_GET_SIZE(tensors) != self->n_tensors) Py_RETURN_FALSE;
  uint64_t ptrs[MAX_TENSORS];
  for (int i = 0; i < self->n_tensors; ++i) {
    PyObject* p = PyObject_CallMethodNoArgs(PyTuple_GET_ITEM(tensors, i), str_data_ptr);
    if (!p) return NULL;
    ptrs[i] = PyLong_AsUnsignedLongLong(p);
    Py_DECREF(p);
    if (PyErr_Occurred()) return NULL;
    if (((ptrs[i] & 15) == 0) != self->aligned[i]) Py_RETURN_FALSE;
  }
  void* stream = NULL;
  if (!test_launcher) {
    if (!cu_launch) Py_RETURN_FALSE;
    void* ctx = NULL;
    if (cu_context(&ctx) != 0 || ctx != self->context) Py_RETURN_FALSE;
    PyObject* s = PyObject_CallOneArg(self->get_stream, self->device);
    if (!s) return NULL;
    stream = PyLong_AsVoidPtr(s);
    Py_DECREF(s);
    if (PyErr_Occurred()) return NULL;
    int capturing = 0;
    if (cu_capturing(stream, &capturing) != 0 || capturing != 0) Py_RETURN_FALSE;
  }
  long long epoch, half;
  counter_advance(self->counter, self->barriers, &epoch, &half);
  for (int i = 0; i < self->n_tensors; ++i) self->cells[self->tensor_param[i]] = ptrs[i];
  if (self->epoch_param >= 0) self->cells[self->epoch_param] = (uint64_t)(uint32_t)epoch;
  if (self->offset_param >= 0) self->cells[self->offset_param] = (uint64_t)(half / 16);
  self->runs += 1;
  if (self->grid[0] == 0 || self->grid[1] == 0 || self->grid[2] == 0) Py_RETURN_TRUE;
  if (test_launcher) {
    PyObject* cells = PyList_New(self->n_params);
    if (!cells) return NULL;
    for (Py_ssize_t i = 0; i < self->n_params; ++i)
      PyList_SET_ITEM(cells, i, PyLong_FromUnsignedLongLong(self->cells[i]));
    PyObject* r = PyObject_CallFunction(
        test_launcher, "K(III)IIN", (unsigned long long)(uintptr_t)self->function, self->grid[0],
        self->grid[1], self->grid[2], self->block, self->shared, cells);
    if (!r) return NULL;
    Py_DECREF(r);
    Py_RETURN_TRUE;
  }
  int err = cu_launch(self->function, self->grid[0], self->grid[1], self->grid[2], self->block, 1,
                      1, self->shared, stream, self->params, NULL);
  if (err != 0) {
    PyErr_Format(PyExc_RuntimeError, "tritonkit native launch: cuLaunchKernel failed (CUDA error %d)",
                 err);
    return NULL;
  }
  Py_RETURN_TRUE;
}

static PyMethodDef Launch_methods[] = {
    {"run", (PyCFunction)Launch_run, METH_O, "run(tensors) -> bool: launched"},
    {NULL, NULL, 0, NULL}};

static PyMemberDef Launch_members[] = {
    {"runs", T_LONGLONG, offsetof(Launch, runs), READONLY, "launches made"},
    {NULL, 0, 0, 0, NULL}};

static PyTypeObject LaunchType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "tritonkit_native_launch.Launch",
    .tp_basicsize = sizeof(Launch),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Launch_init,
    .tp_dealloc = (destructor)Launch_dealloc,
    .tp_methods = Launch_methods,
    .tp_members = Launch_members,
};

// ---- module ----------------------------------------------------------------------------------

static PyObject* current_context(PyObject* self, PyObject* unused) {
  load_driver();
  void* ctx = NULL;
  if (!cu_launch || cu_context(&ctx) != 0) Py_RETURN_NONE;
  return PyLong_FromVoidPtr(ctx);
}

static PyObject* set_test_launcher(PyObject* self, PyObject* fn) {
  Py_XSETREF(test_launcher, fn == Py_None ? NULL : Py_NewRef(fn));
  Py_RETURN_NONE;
}

static PyMethodDef module_methods[] = {
    {"current_context", current_context, METH_NOARGS,
     "the calling thread's current CUcontext as an int, or None without a driver"},
    {"set_test_launcher", set_test_launcher, METH_O,
     "tests: a callable in place of the driver (None: the driver again)"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "tritonkit_native_launch", NULL, -1,
                                        module_methods};

PyMODINIT_FUNC PyInit_tritonkit_native_launch(void) {
  if (PyType_Ready(&CounterType) < 0 || PyType_Ready(&LaunchType) < 0) return NULL;
  str_data_ptr = PyUnicode_InternFromString("data_ptr");
  PyObject* m = PyModule_Create(&module_def);
  if (!m || !str_data_ptr) return NULL;
  Py_INCREF(&CounterType);
  Py_INCREF(&LaunchType);
  if (PyModule_AddObject(m, "Counter", (PyObject*)&CounterType) < 0 ||
      PyModule_AddObject(m, "Launch", (PyObject*)&LaunchType) < 0)
    return NULL;
  return m;
}
