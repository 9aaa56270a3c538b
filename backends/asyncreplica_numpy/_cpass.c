/* One C-level pass over a batch of numpy arrays: describe, pack, view.
 *
 * The compiled counterpart of asyncreplica_numpy/_pypass.py, which defines the same three
 * functions with the same results (tests/backends/test_batch_pass.py runs both). The numpy
 * backend uses this module when hatch_build.py compiled it and ASYNCREPLICA_NO_EXTENSIONS is
 * not set at run time (asyncreplica/_compiled.py decides); it falls back to _pypass otherwise.
 *
 * Every function only answers "this batch is the plain kind, and here is the result" or "it is
 * not" (None / -1): every rule about what a collective accepts, and every error message, stays
 * in the Python code that runs when the answer is "not".
 *
 * Built with numpy's C API (the build hook passes numpy.get_include()): reading an array's type,
 * dtype, shape, flags and data pointer is a few loads, where the buffer protocol would make
 * numpy build a format string and a buffer-info record per leaf (~750 instructions).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#include <numpy/arrayobject.h>
#include <string.h>

/* 1 when `descr` is `first` or compares equal to it (as Python's `==`), 0 when not, -1 on error. */
static int
same_dtype(PyArray_Descr *descr, PyArray_Descr *first)
{
    if (descr == first) {
        return 1;
    }
    return PyObject_RichCompareBool((PyObject *)descr, (PyObject *)first, Py_EQ);
}

/* 1 when the array's shape is the tuple `shape` of ints, 0 when not, -1 on error. */
static int
shape_is(PyArrayObject *array, PyObject *shape)
{
    if (!PyTuple_Check(shape)) {
        PyErr_SetString(PyExc_TypeError, "a shape must be a tuple");
        return -1;
    }
    int nd = PyArray_NDIM(array);
    if (PyTuple_GET_SIZE(shape) != nd) {
        return 0;
    }
    npy_intp *dims = PyArray_DIMS(array);
    for (int k = 0; k < nd; k++) {
        Py_ssize_t d = PyLong_AsSsize_t(PyTuple_GET_ITEM(shape, k));
        if (d == -1 && PyErr_Occurred()) {
            return -1;
        }
        if (d != dims[k]) {
            return 0;
        }
    }
    return 1;
}

/* describe(values, by_dtype) -> (specs, dtype, shapes) | None
 *
 * `values`: one replica's leaves (a list or tuple). `by_dtype`: {dtype: {shape: spec}}.
 * When every leaf is exactly a numpy.ndarray, all of one dtype (==), and every leaf's shape
 * has a spec: the tuple of specs, the dtype, and the one shape (a tuple) when all leaves have
 * it, else each leaf's shape (a list of tuples). None otherwise, and for no leaves.
 */
static PyObject *
cpass_describe(PyObject *self, PyObject *args)
{
    PyObject *values, *by_dtype;
    if (!PyArg_ParseTuple(args, "OO!:describe", &values, &PyDict_Type, &by_dtype)) {
        return NULL;
    }
    PyObject *seq = PySequence_Fast(values, "describe() needs a sequence of leaves");
    if (seq == NULL) {
        return NULL;
    }
    PyObject *result = NULL, *specs = NULL, *shapes = NULL;
    Py_ssize_t m = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    if (m == 0 || Py_TYPE(items[0]) != &PyArray_Type) {
        goto none;
    }
    PyArrayObject *first = (PyArrayObject *)items[0];
    PyArray_Descr *dtype = PyArray_DESCR(first);
    int nd = PyArray_NDIM(first);
    npy_intp *dims = PyArray_DIMS(first);
    int uniform = 1;
    for (Py_ssize_t j = 1; j < m; j++) {
        PyObject *leaf = items[j];
        if (Py_TYPE(leaf) != &PyArray_Type) {
            goto none;
        }
        PyArrayObject *array = (PyArrayObject *)leaf;
        int same = same_dtype(PyArray_DESCR(array), dtype);
        if (same < 0) {
            goto done;
        }
        if (!same) {
            goto none;
        }
        if (uniform && (PyArray_NDIM(array) != nd ||
                        memcmp(PyArray_DIMS(array), dims, nd * sizeof(npy_intp)) != 0)) {
            uniform = 0;
        }
    }
    PyObject *by_shape = PyDict_GetItemWithError(by_dtype, (PyObject *)dtype);
    if (by_shape == NULL) {
        if (PyErr_Occurred()) {
            goto done;
        }
        goto none;
    }
    if (!PyDict_Check(by_shape)) {
        PyErr_SetString(PyExc_TypeError, "by_dtype's values must be dicts");
        goto done;
    }
    specs = PyTuple_New(m);
    if (specs == NULL) {
        goto done;
    }
    if (uniform) {
        shapes = PyArray_IntTupleFromIntp(nd, dims);
        if (shapes == NULL) {
            goto done;
        }
        PyObject *spec = PyDict_GetItemWithError(by_shape, shapes);
        if (spec == NULL) {
            if (PyErr_Occurred()) {
                goto done;
            }
            goto none;
        }
        for (Py_ssize_t j = 0; j < m; j++) {
            Py_INCREF(spec);
            PyTuple_SET_ITEM(specs, j, spec);
        }
    }
    else {
        shapes = PyList_New(m);
        if (shapes == NULL) {
            goto done;
        }
        for (Py_ssize_t j = 0; j < m; j++) {
            PyArrayObject *array = (PyArrayObject *)items[j];
            PyObject *shape = PyArray_IntTupleFromIntp(PyArray_NDIM(array), PyArray_DIMS(array));
            if (shape == NULL) {
                goto done;
            }
            PyList_SET_ITEM(shapes, j, shape);
            PyObject *spec = PyDict_GetItemWithError(by_shape, shape);
            if (spec == NULL) {
                if (PyErr_Occurred()) {
                    goto done;
                }
                goto none;
            }
            Py_INCREF(spec);
            PyTuple_SET_ITEM(specs, j, spec);
        }
    }
    result = PyTuple_Pack(3, specs, (PyObject *)dtype, shapes);
    goto done;
none:
    result = Py_NewRef(Py_None);
done:
    Py_XDECREF(specs);
    Py_XDECREF(shapes);
    Py_DECREF(seq);
    return result;
}

/* pack(row, lo, hi, dtype, shapes, out) -> bytes written, or -1
 *
 * Copies the bytes of leaves row[lo:hi], in order, to the start of `out` (a writable,
 * C-contiguous array). Every leaf must be exactly a numpy.ndarray of `dtype` (==), of its
 * shape (`shapes`: one tuple for every leaf, or a list of each leaf's, indexed like `row`),
 * and C-contiguous, and they must fit in `out`; -1 (nothing promised about `out`) otherwise.
 */
static PyObject *
cpass_pack(PyObject *self, PyObject *args)
{
    PyObject *row, *shapes;
    Py_ssize_t lo, hi;
    PyArray_Descr *dtype;
    PyArrayObject *out;
    if (!PyArg_ParseTuple(args, "OnnO!OO!:pack", &row, &lo, &hi, &PyArrayDescr_Type, &dtype,
                          &shapes, &PyArray_Type, &out)) {
        return NULL;
    }
    if (!PyArray_IS_C_CONTIGUOUS(out) || !PyArray_ISWRITEABLE(out)) {
        PyErr_SetString(PyExc_ValueError, "pack() writes to a writable, C-contiguous array");
        return NULL;
    }
    PyObject *seq = PySequence_Fast(row, "pack() needs a sequence of leaves");
    if (seq == NULL) {
        return NULL;
    }
    Py_ssize_t m = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    int uniform = PyTuple_Check(shapes);
    if (lo < 0 || hi > m || lo > hi || (!uniform && (!PyList_Check(shapes) ||
                                                     PyList_GET_SIZE(shapes) != m))) {
        Py_DECREF(seq);
        PyErr_SetString(PyExc_ValueError, "pack(): bad range or shapes");
        return NULL;
    }
    /* The one shape, as numpy dimensions (compared with memcmp). */
    npy_intp dims[NPY_MAXDIMS];
    int nd = 0;
    if (uniform) {
        nd = (int)PyTuple_GET_SIZE(shapes);
        if (nd > NPY_MAXDIMS) {
            Py_DECREF(seq);
            return PyLong_FromLong(-1);
        }
        for (int k = 0; k < nd; k++) {
            dims[k] = PyLong_AsSsize_t(PyTuple_GET_ITEM(shapes, k));
            if (dims[k] == -1 && PyErr_Occurred()) {
                Py_DECREF(seq);
                return NULL;
            }
        }
    }
    char *dest = PyArray_BYTES(out);
    npy_intp room = PyArray_NBYTES(out);
    npy_intp written = 0;
    for (Py_ssize_t j = lo; j < hi; j++) {
        PyObject *leaf = items[j];
        if (Py_TYPE(leaf) != &PyArray_Type) {
            goto mismatch;
        }
        PyArrayObject *array = (PyArrayObject *)leaf;
        int same = same_dtype(PyArray_DESCR(array), dtype);
        if (same <= 0) {
            goto fail_or_mismatch;
        }
        if (uniform) {
            if (PyArray_NDIM(array) != nd ||
                memcmp(PyArray_DIMS(array), dims, nd * sizeof(npy_intp)) != 0) {
                goto mismatch;
            }
        }
        else {
            same = shape_is(array, PyList_GET_ITEM(shapes, j));
            if (same <= 0) {
                goto fail_or_mismatch;
            }
        }
        if (!PyArray_IS_C_CONTIGUOUS(array)) {
            goto mismatch;
        }
        npy_intp nbytes = PyArray_NBYTES(array);
        if (nbytes > room - written) {
            goto mismatch;
        }
        if (nbytes) {
            memcpy(dest + written, PyArray_BYTES(array), (size_t)nbytes);
        }
        written += nbytes;
    }
    Py_DECREF(seq);
    return PyLong_FromSsize_t((Py_ssize_t)written);
fail_or_mismatch:
    if (PyErr_Occurred()) {
        Py_DECREF(seq);
        return NULL;
    }
mismatch:
    Py_DECREF(seq);
    return PyLong_FromLong(-1);
}

/* views(flat, n, shapes, lo, hi) -> n lists of hi - lo read-only views
 *
 * `flat`: a read-only, C-contiguous 1-d array that owns its data, holding leaves lo..hi-1 one
 * after the other. `shapes`: one tuple for every leaf, or a list of each leaf's (indexed from
 * 0, like the batch). Every replica gets its own view of every leaf; each view's base is
 * `flat`, which is read-only and owns its data, so no view can be made writable again.
 */
static PyObject *
cpass_views(PyObject *self, PyObject *args)
{
    PyArrayObject *flat;
    Py_ssize_t n, lo, hi;
    PyObject *shapes;
    if (!PyArg_ParseTuple(args, "O!nOnn:views", &PyArray_Type, &flat, &n, &shapes, &lo, &hi)) {
        return NULL;
    }
    int uniform = PyTuple_Check(shapes);
    if (PyArray_ISWRITEABLE(flat) || !PyArray_CHKFLAGS(flat, NPY_ARRAY_OWNDATA) ||
        PyArray_NDIM(flat) != 1 || !PyArray_IS_C_CONTIGUOUS(flat) || n < 0 || lo < 0 ||
        lo > hi || (!uniform && (!PyList_Check(shapes) || PyList_GET_SIZE(shapes) < hi))) {
        PyErr_SetString(PyExc_ValueError,
                        "views() needs a read-only 1-d array that owns its data, and shapes");
        return NULL;
    }
    PyArray_Descr *dtype = PyArray_DESCR(flat);
    npy_intp itemsize = PyArray_ITEMSIZE(flat);
    Py_ssize_t count = hi - lo;
    /* Each leaf's dimensions (from `starts[k]` in `dims`) and byte offset, read once for all
     * replicas. */
    Py_ssize_t total_nd = 0;
    for (Py_ssize_t k = 0; k < count; k++) {
        PyObject *shape = uniform ? shapes : PyList_GET_ITEM(shapes, lo + k);
        if (!PyTuple_Check(shape) || PyTuple_GET_SIZE(shape) > NPY_MAXDIMS) {
            PyErr_SetString(PyExc_ValueError, "views(): a shape must be a tuple of ints");
            return NULL;
        }
        total_nd += uniform ? 0 : PyTuple_GET_SIZE(shape);
    }
    if (uniform) {
        total_nd = PyTuple_GET_SIZE(shapes);
    }
    npy_intp *dims = PyMem_Malloc(sizeof(npy_intp) * (size_t)(total_nd ? total_nd : 1));
    npy_intp *offsets = PyMem_Malloc(sizeof(npy_intp) * (size_t)(count ? count : 1));
    Py_ssize_t *starts = PyMem_Malloc(sizeof(Py_ssize_t) * (size_t)(count ? count : 1));
    int *ndims = PyMem_Malloc(sizeof(int) * (size_t)(count ? count : 1));
    PyObject *result = NULL;
    if (dims == NULL || offsets == NULL || starts == NULL || ndims == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    npy_intp offset = 0;
    Py_ssize_t next = 0;
    for (Py_ssize_t k = 0; k < count; k++) {
        PyObject *shape = uniform ? shapes : PyList_GET_ITEM(shapes, lo + k);
        int nd = (int)PyTuple_GET_SIZE(shape);
        if (uniform && k > 0) {
            starts[k] = 0;  /* the one shape, read for leaf 0 */
        }
        else {
            starts[k] = next;
            for (int d = 0; d < nd; d++) {
                npy_intp dim = PyLong_AsSsize_t(PyTuple_GET_ITEM(shape, d));
                if (dim == -1 && PyErr_Occurred()) {
                    goto done;
                }
                if (dim < 0) {
                    PyErr_SetString(PyExc_ValueError, "views(): a negative dimension");
                    goto done;
                }
                dims[next + d] = dim;
            }
            next += nd;
        }
        npy_intp size = 1;
        for (int d = 0; d < nd; d++) {
            size *= dims[starts[k] + d];
        }
        ndims[k] = nd;
        offsets[k] = offset;
        offset += size * itemsize;
    }
    if (offset > PyArray_NBYTES(flat)) {
        PyErr_SetString(PyExc_ValueError, "views(): the shapes do not fit in the array");
        goto done;
    }
    result = PyList_New(n);
    if (result == NULL) {
        goto done;
    }
    char *data = PyArray_BYTES(flat);
    for (Py_ssize_t r = 0; r < n; r++) {
        PyObject *row = PyList_New(count);
        if (row == NULL) {
            Py_CLEAR(result);
            goto done;
        }
        PyList_SET_ITEM(result, r, row);
        for (Py_ssize_t k = 0; k < count; k++) {
            Py_INCREF(dtype); /* stolen by the call */
            PyObject *view = PyArray_NewFromDescr(
                &PyArray_Type, dtype, ndims[k], dims + starts[k], NULL,
                data + offsets[k], NPY_ARRAY_C_CONTIGUOUS | NPY_ARRAY_ALIGNED, NULL);
            if (view == NULL) {
                Py_CLEAR(result);
                goto done;
            }
            PyList_SET_ITEM(row, k, view);
            Py_INCREF(flat); /* stolen by the call: the view's base */
            if (PyArray_SetBaseObject((PyArrayObject *)view, (PyObject *)flat) < 0) {
                Py_CLEAR(result);
                goto done;
            }
        }
    }
done:
    PyMem_Free(dims);
    PyMem_Free(offsets);
    PyMem_Free(starts);
    PyMem_Free(ndims);
    return result;
}

static PyMethodDef cpass_methods[] = {
    {"describe", cpass_describe, METH_VARARGS,
     "describe(values, by_dtype) -> (specs, dtype, shapes) | None"},
    {"pack", cpass_pack, METH_VARARGS,
     "pack(row, lo, hi, dtype, shapes, out) -> bytes written, or -1"},
    {"views", cpass_views, METH_VARARGS,
     "views(flat, n, shapes, lo, hi) -> n lists of read-only views"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef cpass_module = {
    PyModuleDef_HEAD_INIT, "_cpass",
    "One C-level pass over a batch of numpy arrays (see _pypass.py, the same in Python).", -1,
    cpass_methods,
};

PyMODINIT_FUNC
PyInit__cpass(void)
{
    import_array();
    return PyModule_Create(&cpass_module);
}
