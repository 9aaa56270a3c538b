/* One C-level pass over a batch of numpy arrays (describe, pack, views), and freeze.
 *
 * The compiled counterpart of the pure-Python pass in asyncreplica_numpy/_backend.py:
 * NumpyBackend.describe_leaves (its Python branch), _batch_layout, _combine_packed and
 * _reduce_batch, and _frozen for freeze. Both give the same results
 * (tests/backends/test_batch_pass.py runs both in one process). The numpy backend uses this
 * module when hatch_build.py compiled it and asyncreplica/_compiled.py's c_extension_reason
 * finds nothing against it (ASYNCREPLICA_NO_EXTENSIONS=1, a changed source); it runs the
 * Python pass otherwise.
 *
 * Every function only answers "this batch is the plain kind, and here is the result" or "it is
 * not" (None / -1): every rule about what a collective accepts, and every error message a user
 * sees, stays in the Python code that runs when the answer is "not".
 *
 * Anyone can import this module and call it, so every function checks its arguments as if the
 * caller were hostile, and raises TypeError or ValueError for what the backend never passes:
 *
 * - Arrays are exactly numpy.ndarray (no subclass) of a number dtype (bool, integers, floats,
 *   complex: no object references, no fields), and an output is C-contiguous, writable, of
 *   the stated dtype and shares no memory with any input.
 * - Shapes are tuples of exact ints (an int subclass's __index__ would run Python code), and
 *   every size, offset and sum of them is checked for overflow before it is used.
 * - No borrowed reference is held across code that can run Python code: an allocation (the
 *   garbage collector runs finalizers), a dict lookup (a key's __eq__), a dtype comparison.
 *   Sequences' items, dicts and dtypes are held by a strong reference while they are used; a
 *   list is read again, by index and with its current length, after each such call; and an
 *   array's dimensions are copied before anything is allocated.
 * - Results are read-only arrays whose base is an _Owner: a small type that holds the array
 *   whose memory they show, exports no buffer, has no attributes and cannot be created,
 *   copied or pickled from Python. numpy lets an array be made writable again only when its
 *   base chain ends in something writable, so neither a result nor its base can be.
 *
 * Built with numpy's C API (the build hook passes numpy.get_include()): reading an array's type,
 * dtype, shape, flags and data pointer is a few loads, where the buffer protocol would make
 * numpy build a format string and a buffer-info record per leaf (~750 instructions).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#include <numpy/arrayobject.h>
#include <stdint.h>
#include <string.h>

/* ---- The owner of results' memory ------------------------------------------------------- */

typedef struct {
    PyObject_HEAD
    PyObject *array; /* the array whose memory the results show; never exposed */
} Owner;

static void
owner_dealloc(Owner *self)
{
    Py_XDECREF(self->array);
    PyObject_Free(self);
}

/* No tp_new (Python cannot create one), no buffer (numpy cannot make a view of it writable),
 * no members, no tp_traverse (it holds one array of a number dtype, which holds no objects,
 * so it is in no reference cycle, and gc.get_referents shows nothing). */
static PyTypeObject OwnerType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "asyncreplica_numpy._cpass._Owner",
    .tp_basicsize = sizeof(Owner),
    .tp_dealloc = (destructor)owner_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Holds the memory of read-only results; exposes nothing.",
};

/* A new owner of `array`'s memory, or NULL with an exception. */
static PyObject *
owner_new(PyArrayObject *array)
{
    Owner *owner = PyObject_New(Owner, &OwnerType);
    if (owner == NULL) {
        return NULL;
    }
    Py_INCREF(array);
    owner->array = (PyObject *)array;
    return (PyObject *)owner;
}

/* ---- Checks ----------------------------------------------------------------------------- */

/* 1 when `descr` is `first` or equivalent to it, else 0: Python's `==` on two dtypes, which is
 * PyArray_EquivTypes, called here without converting anything. Both are held meanwhile. */
static int
same_dtype(PyArray_Descr *descr, PyArray_Descr *first)
{
    if (descr == first) {
        return 1;
    }
    Py_INCREF(descr);
    Py_INCREF(first);
    int same = PyArray_EquivTypes(descr, first);
    Py_DECREF(first);
    Py_DECREF(descr);
    return same;
}

/* 0 when `descr` is a number dtype (bool, integer, float, complex: plain bytes, no object
 * references, no fields), else -1 with TypeError naming `what`. */
static int
check_number_dtype(PyArray_Descr *descr, const char *what)
{
    if (!PyDataType_ISNUMBER(descr) || PyDataType_REFCHK(descr) || PyDataType_ELSIZE(descr) <= 0) {
        PyErr_Format(PyExc_TypeError, "%s must have a bool, integer, float or complex dtype",
                     what);
        return -1;
    }
    return 0;
}

/* 0 when `obj` is exactly a numpy.ndarray of a number dtype, else -1 with TypeError. */
static int
check_array(PyObject *obj, const char *what)
{
    if (!PyArray_CheckExact(obj)) {
        PyErr_Format(PyExc_TypeError, "%s must be a numpy.ndarray, not %.100s", what,
                     Py_TYPE(obj)->tp_name);
        return -1;
    }
    return check_number_dtype(PyArray_DESCR((PyArrayObject *)obj), what);
}

/* Reads `shape`, a tuple of exact non-negative ints, into dims[0..*nd). 1 on success; 0 when
 * it cannot be an array's shape (too many dimensions, a negative one, a size that overflows
 * `itemsize` bytes per element), *nbytes then unset; -1 with TypeError when it is not a tuple
 * of ints. `*nbytes` gets the size in bytes of an array of that shape. Runs no Python code. */
static int
read_shape(PyObject *shape, npy_intp *dims, int *nd, npy_intp itemsize, npy_intp *nbytes)
{
    if (!PyTuple_Check(shape)) {
        PyErr_SetString(PyExc_TypeError, "a shape must be a tuple of ints");
        return -1;
    }
    Py_ssize_t size = PyTuple_GET_SIZE(shape);
    int fits = size <= NPY_MAXDIMS;
    npy_intp total = itemsize;
    for (Py_ssize_t k = 0; k < size; k++) {
        PyObject *item = PyTuple_GET_ITEM(shape, k);
        if (!PyLong_CheckExact(item)) {
            PyErr_SetString(PyExc_TypeError, "a shape must be a tuple of ints");
            return -1;
        }
        int overflow = 0;
        long long dim = PyLong_AsLongLongAndOverflow(item, &overflow);
        if (dim == -1 && PyErr_Occurred()) {
            return -1;
        }
        if (overflow || dim < 0 || dim > NPY_MAX_INTP) {
            fits = 0;
            continue;
        }
        if (fits) {
            dims[k] = (npy_intp)dim;
            if (dim != 0 && total > NPY_MAX_INTP / (npy_intp)dim) {
                fits = 0;
            }
            else {
                total *= (npy_intp)dim;
            }
        }
    }
    if (!fits) {
        return 0;
    }
    *nd = (int)size;
    *nbytes = total;
    return 1;
}

/* 1 when the array's dimensions are dims[0..nd), else 0 (no memcmp: a 0-d array's dimensions
 * may be a NULL pointer). */
static int
dims_are(PyArrayObject *array, const npy_intp *dims, int nd)
{
    if (PyArray_NDIM(array) != nd) {
        return 0;
    }
    const npy_intp *own = PyArray_DIMS(array);
    for (int k = 0; k < nd; k++) {
        if (own[k] != dims[k]) {
            return 0;
        }
    }
    return 1;
}

/* A new reference to item j of `seq` (a list or tuple), or NULL (no exception) when the
 * sequence is shorter now. A list is read by index with its current length each time, so
 * Python code run since the last read (a finalizer that emptied it) cannot leave a dangling
 * pointer behind. */
static PyObject *
item_ref(PyObject *seq, Py_ssize_t j)
{
    if (j >= PySequence_Fast_GET_SIZE(seq)) {
        return NULL;
    }
    return Py_NewRef(PySequence_Fast_GET_ITEM(seq, j));
}

/* A tuple of the array's shape, from a copy of its dimensions (the allocation may run a
 * finalizer that reshapes the array and frees the dimensions it had). */
static PyObject *
shape_of(PyArrayObject *array)
{
    npy_intp dims[NPY_MAXDIMS];
    int nd = PyArray_NDIM(array);
    if (nd > NPY_MAXDIMS) {
        PyErr_SetString(PyExc_ValueError, "an array has more dimensions than this build knows");
        return NULL;
    }
    for (int k = 0; k < nd; k++) {
        dims[k] = PyArray_DIMS(array)[k];
    }
    return PyArray_IntTupleFromIntp(nd, dims);
}

/* A new reference to by[key], or NULL: with an exception on error, without one when missing.
 * `by` must be held by the caller: the lookup can run a key's __eq__. */
static PyObject *
lookup(PyObject *by, PyObject *key)
{
    PyObject *value = PyDict_GetItemWithError(by, key);
    Py_XINCREF(value); /* before anything else can run */
    return value;
}

/* A tuple holding a reference to each item of `values`, copied with nothing that can run
 * Python in between. A tuple is its own (immutable: its items are held while it is).
 * PySequence_Tuple of a list keeps the list's item array while it allocates the tuple; that
 * allocation can run the garbage collector, and a finalizer that clears the list then frees
 * the items being copied. So a list's tuple is allocated first, then filled by index with
 * the list's current size: a list that changed meanwhile gives a shorter tuple of live
 * items (the callers then take the Python pass, which checks everything again).
 * Any other sequence: PySequence_Tuple, which copies it through a new list of its own. */
static PyObject *
own_items(PyObject *values)
{
    if (PyTuple_CheckExact(values)) {
        Py_INCREF(values);
        return values;
    }
    if (!PyList_CheckExact(values)) {
        return PySequence_Tuple(values);
    }
    Py_ssize_t n = PyList_GET_SIZE(values);
    PyObject *tuple = PyTuple_New(n); /* may run the garbage collector */
    if (tuple == NULL) {
        return NULL;
    }
    Py_ssize_t now = PyList_GET_SIZE(values);
    Py_ssize_t count = now < n ? now : n;
    for (Py_ssize_t j = 0; j < count; j++) { /* no allocation: nothing runs in between */
        PyObject *item = PyList_GET_ITEM(values, j);
        Py_INCREF(item);
        PyTuple_SET_ITEM(tuple, j, item);
    }
    if (count < n) {
        /* The list shrank: a shorter tuple of the items still there. */
        PyObject *shorter = PyTuple_GetSlice(tuple, 0, count);
        Py_DECREF(tuple);
        return shorter;
    }
    return tuple;
}

/* ---- describe --------------------------------------------------------------------------- */

/* describe(values, by_dtype) -> (specs, dtype, shapes) | None
 *
 * `values`: one replica's leaves (a sequence). `by_dtype`: {dtype: {shape: spec}} (dicts).
 * When every leaf is exactly a numpy.ndarray, all of one dtype (==), and every leaf's shape
 * has a spec: the tuple of specs, the dtype, and the one shape (a tuple) when all leaves have
 * it, else each leaf's shape (a list of tuples). None otherwise, and for no leaves.
 */
static PyObject *
cpass_describe(PyObject *Py_UNUSED(self), PyObject *args)
{
    PyObject *values, *by_dtype;
    if (!PyArg_ParseTuple(args, "OO!:describe", &values, &PyDict_Type, &by_dtype)) {
        return NULL;
    }
    if (!PyDict_CheckExact(by_dtype)) {
        PyErr_SetString(PyExc_TypeError, "describe(): by_dtype must be a dict");
        return NULL;
    }
    /* Our own tuple of the leaves: each is held for the whole call. */
    PyObject *seq = own_items(values);
    if (seq == NULL) {
        return NULL;
    }
    PyObject *result = NULL, *specs = NULL, *shapes = NULL, *by_shape = NULL;
    PyArray_Descr *dtype = NULL;
    Py_ssize_t m = PyTuple_GET_SIZE(seq);
    if (PyList_CheckExact(values) && PyList_GET_SIZE(values) != m) {
        goto none; /* the list changed while it was copied: the Python pass decides */
    }
    if (m == 0 || !PyArray_CheckExact(PyTuple_GET_ITEM(seq, 0))) {
        goto none;
    }
    PyArrayObject *first = (PyArrayObject *)PyTuple_GET_ITEM(seq, 0);
    dtype = PyArray_DESCR(first);
    Py_INCREF(dtype);
    int nd = PyArray_NDIM(first);
    if (nd > NPY_MAXDIMS) {
        goto none;
    }
    npy_intp dims[NPY_MAXDIMS];
    for (int k = 0; k < nd; k++) {
        dims[k] = PyArray_DIMS(first)[k];
    }
    int uniform = 1;
    for (Py_ssize_t j = 1; j < m; j++) {
        PyObject *leaf = PyTuple_GET_ITEM(seq, j);
        if (!PyArray_CheckExact(leaf)) {
            goto none;
        }
        PyArrayObject *array = (PyArrayObject *)leaf;
        if (!same_dtype(PyArray_DESCR(array), dtype)) {
            goto none;
        }
        if (uniform && !dims_are(array, dims, nd)) {
            uniform = 0;
        }
    }
    by_shape = lookup(by_dtype, (PyObject *)dtype);
    if (by_shape == NULL) {
        if (PyErr_Occurred()) {
            goto done;
        }
        goto none;
    }
    if (!PyDict_CheckExact(by_shape)) {
        PyErr_SetString(PyExc_TypeError, "describe(): by_dtype's values must be dicts");
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
        PyObject *spec = lookup(by_shape, shapes);
        if (spec == NULL) {
            if (PyErr_Occurred()) {
                goto done;
            }
            goto none;
        }
        for (Py_ssize_t j = 0; j < m; j++) {
            PyTuple_SET_ITEM(specs, j, Py_NewRef(spec));
        }
        Py_DECREF(spec);
    }
    else {
        shapes = PyList_New(m);
        if (shapes == NULL) {
            goto done;
        }
        for (Py_ssize_t j = 0; j < m; j++) {
            PyObject *shape = shape_of((PyArrayObject *)PyTuple_GET_ITEM(seq, j));
            if (shape == NULL) {
                goto done;
            }
            PyList_SET_ITEM(shapes, j, shape);
            PyObject *spec = lookup(by_shape, shape);
            if (spec == NULL) {
                if (PyErr_Occurred()) {
                    goto done;
                }
                goto none;
            }
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
    Py_XDECREF(by_shape);
    Py_XDECREF(dtype);
    Py_DECREF(seq);
    return result;
}

/* ---- pack ------------------------------------------------------------------------------- */

/* 1 when the memory ranges [a, a + an) and [b, b + bn) overlap (both non-empty). */
static int
overlaps(const char *a, npy_intp an, const char *b, npy_intp bn)
{
    uintptr_t a0 = (uintptr_t)a, b0 = (uintptr_t)b;
    return an > 0 && bn > 0 && a0 < b0 + (uintptr_t)bn && b0 < a0 + (uintptr_t)an;
}

/* 0 when `out` may be written as pack's output of `dtype`, else -1 with an exception. Read
 * again before each copy: a finalizer run meanwhile may have changed the array. */
static int
check_out(PyArrayObject *out, PyArray_Descr *dtype)
{
    if (!same_dtype(PyArray_DESCR(out), dtype)) {
        PyErr_SetString(PyExc_TypeError, "pack(): out must have the leaves' dtype");
        return -1;
    }
    if (!PyArray_IS_C_CONTIGUOUS(out) || !PyArray_ISWRITEABLE(out)) {
        PyErr_SetString(PyExc_ValueError, "pack() writes to a writable, C-contiguous array");
        return -1;
    }
    return 0;
}

/* pack(row, lo, hi, dtype, shapes, out) -> bytes written, or -1
 *
 * Copies the bytes of leaves row[lo:hi], in order, to the start of `out` (exactly a
 * numpy.ndarray of `dtype`, writable, C-contiguous, sharing no memory with a leaf). Every leaf
 * must be exactly a numpy.ndarray of `dtype` (==), of its shape (`shapes`: one tuple for every
 * leaf, or a list of each leaf's, indexed like `row`), and C-contiguous, and they must fit in
 * `out`; -1 (nothing promised about `out`) otherwise.
 */
static PyObject *
cpass_pack(PyObject *Py_UNUSED(self), PyObject *args)
{
    PyObject *row, *shapes, *out_obj;
    Py_ssize_t lo, hi;
    PyArray_Descr *dtype;
    if (!PyArg_ParseTuple(args, "OnnO!OO:pack", &row, &lo, &hi, &PyArrayDescr_Type, &dtype,
                          &shapes, &out_obj)) {
        return NULL;
    }
    if (check_number_dtype(dtype, "pack()'s dtype") < 0 ||
        check_array(out_obj, "pack()'s out") < 0) {
        return NULL;
    }
    PyArrayObject *out = (PyArrayObject *)out_obj;
    if (check_out(out, dtype) < 0) {
        return NULL;
    }
    int uniform = PyTuple_Check(shapes);
    if (!uniform && !PyList_Check(shapes)) {
        PyErr_SetString(PyExc_TypeError, "pack(): shapes must be a tuple or a list of tuples");
        return NULL;
    }
    PyObject *seq = PySequence_Fast(row, "pack() needs a sequence of leaves");
    if (seq == NULL) {
        return NULL;
    }
    Py_ssize_t m = PySequence_Fast_GET_SIZE(seq);
    if (lo < 0 || hi > m || lo > hi || (!uniform && PyList_GET_SIZE(shapes) != m)) {
        Py_DECREF(seq);
        PyErr_SetString(PyExc_ValueError, "pack(): bad range or shapes");
        return NULL;
    }
    npy_intp itemsize = PyDataType_ELSIZE(dtype);
    /* The one shape, as numpy dimensions, and a leaf's size in bytes. */
    npy_intp dims[NPY_MAXDIMS];
    int nd = 0;
    npy_intp leaf_bytes = 0;
    int known = 1;
    if (uniform) {
        known = read_shape(shapes, dims, &nd, itemsize, &leaf_bytes);
        if (known < 0) {
            Py_DECREF(seq);
            return NULL;
        }
    }
    PyObject *result = NULL;
    PyObject *leaf = NULL, *shape = NULL;
    npy_intp written = 0;
    for (Py_ssize_t j = lo; j < hi; j++) {
        leaf = item_ref(seq, j);
        if (leaf == NULL || !PyArray_CheckExact(leaf) || !known) {
            goto mismatch;
        }
        PyArrayObject *array = (PyArrayObject *)leaf;
        if (!same_dtype(PyArray_DESCR(array), dtype)) {
            goto mismatch;
        }
        if (!uniform) {
            shape = item_ref(shapes, j);
            if (shape == NULL) {
                goto mismatch;
            }
            int fits = read_shape(shape, dims, &nd, itemsize, &leaf_bytes);
            Py_CLEAR(shape);
            if (fits < 0) {
                goto done;
            }
            if (!fits) {
                goto mismatch;
            }
        }
        if (check_out(out, dtype) < 0) {
            goto done;
        }
        /* From here to the copy nothing runs Python code: `out` and the leaf are read now. */
        if (!dims_are(array, dims, nd) || !PyArray_IS_C_CONTIGUOUS(array) ||
            PyArray_ITEMSIZE(array) != itemsize) {
            goto mismatch;
        }
        char *dest = PyArray_BYTES(out);
        npy_intp room = PyArray_NBYTES(out);
        if (overlaps(PyArray_BYTES(array), leaf_bytes, dest, room)) {
            PyErr_SetString(PyExc_ValueError, "pack(): out shares memory with a leaf");
            goto done;
        }
        if (leaf_bytes > room - written) {
            goto mismatch;
        }
        if (leaf_bytes) {
            memcpy(dest + written, PyArray_BYTES(array), (size_t)leaf_bytes);
        }
        written += leaf_bytes;
        Py_CLEAR(leaf);
    }
    result = PyLong_FromSsize_t((Py_ssize_t)written);
    goto done;
mismatch:
    result = PyLong_FromLong(-1);
done:
    Py_XDECREF(leaf);
    Py_XDECREF(shape);
    Py_DECREF(seq);
    return result;
}

/* ---- views ------------------------------------------------------------------------------ */

/* views(flat, n, shapes, lo, hi) -> n lists of hi - lo read-only views
 *
 * `flat`: exactly a numpy.ndarray of a number dtype, 1-d, C-contiguous and aligned, holding
 * leaves lo..hi-1 one after the other. `shapes`: one tuple for every leaf, or a list of each
 * leaf's (indexed from 0, like the batch). Every replica gets its own view of every leaf; each
 * view's base is one _Owner of `flat`, so no view can be made writable again.
 */
static PyObject *
cpass_views(PyObject *Py_UNUSED(self), PyObject *args)
{
    PyObject *flat_obj, *shapes;
    Py_ssize_t n, lo, hi;
    if (!PyArg_ParseTuple(args, "OnOnn:views", &flat_obj, &n, &shapes, &lo, &hi)) {
        return NULL;
    }
    if (check_array(flat_obj, "views()'s flat") < 0) {
        return NULL;
    }
    PyArrayObject *flat = (PyArrayObject *)flat_obj;
    int uniform = PyTuple_Check(shapes);
    if (!uniform && !PyList_Check(shapes)) {
        PyErr_SetString(PyExc_TypeError, "views(): shapes must be a tuple or a list of tuples");
        return NULL;
    }
    if (PyArray_NDIM(flat) != 1 || !PyArray_IS_C_CONTIGUOUS(flat) || !PyArray_ISALIGNED(flat) ||
        n < 0 || lo < 0 || lo > hi || (!uniform && PyList_GET_SIZE(shapes) < hi)) {
        PyErr_SetString(PyExc_ValueError,
                        "views() needs a 1-d, C-contiguous, aligned array, a number of replicas, "
                        "and a range of leaves its shapes cover");
        return NULL;
    }
    npy_intp itemsize = PyArray_ITEMSIZE(flat);
    npy_intp room = PyArray_NBYTES(flat);
    Py_ssize_t count = hi - lo;
    /* Each leaf's dimensions (from `starts[k]` in `dims`) and byte offset, read once for all
     * replicas, before anything that can run Python code. One shape for every leaf: read once,
     * and no leaf's offset is kept (leaf k is at k times its size). */
    npy_intp one_dims[NPY_MAXDIMS];
    int one_nd = 0;
    npy_intp one_bytes = 0;
    npy_intp *dims = NULL, *offsets = NULL;
    Py_ssize_t *starts = NULL;
    int *ndims = NULL;
    PyObject *result = NULL, *owner = NULL;
    PyArray_Descr *dtype = NULL;
    if (uniform) {
        int fits = read_shape(shapes, one_dims, &one_nd, itemsize, &one_bytes);
        if (fits < 0) {
            return NULL;
        }
        if (!fits || (one_bytes && count > room / one_bytes)) {
            PyErr_SetString(PyExc_ValueError, "views(): the shapes do not fit in the array");
            return NULL;
        }
    }
    else {
        Py_ssize_t total_nd = 0;
        for (Py_ssize_t k = 0; k < count; k++) {
            PyObject *shape = PyList_GET_ITEM(shapes, lo + k);
            if (!PyTuple_Check(shape)) {
                PyErr_SetString(PyExc_TypeError, "a shape must be a tuple of ints");
                return NULL;
            }
            total_nd += PyTuple_GET_SIZE(shape); /* count <= len(list), each <= len(tuple) */
        }
        dims = PyMem_New(npy_intp, total_nd ? total_nd : 1);
        offsets = PyMem_New(npy_intp, count ? count : 1);
        starts = PyMem_New(Py_ssize_t, count ? count : 1);
        ndims = PyMem_New(int, count ? count : 1);
        if (dims == NULL || offsets == NULL || starts == NULL || ndims == NULL) {
            PyErr_NoMemory();
            goto done;
        }
        npy_intp offset = 0;
        Py_ssize_t next = 0;
        for (Py_ssize_t k = 0; k < count; k++) {
            npy_intp nbytes = 0;
            int fits = read_shape(PyList_GET_ITEM(shapes, lo + k), dims + next, &ndims[k],
                                  itemsize, &nbytes);
            if (fits < 0) {
                goto done;
            }
            if (!fits || nbytes > room - offset) {
                PyErr_SetString(PyExc_ValueError, "views(): the shapes do not fit in the array");
                goto done;
            }
            starts[k] = next;
            offsets[k] = offset;
            offset += nbytes;
            next += ndims[k];
        }
    }
    dtype = PyArray_DESCR(flat);
    Py_INCREF(dtype);
    char *data = PyArray_BYTES(flat);
    owner = owner_new(flat);
    if (owner == NULL) {
        goto done;
    }
    result = PyList_New(n);
    if (result == NULL) {
        goto done;
    }
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
                &PyArray_Type, dtype, uniform ? one_nd : ndims[k],
                uniform ? one_dims : dims + starts[k], NULL,
                data + (uniform ? k * one_bytes : offsets[k]),
                NPY_ARRAY_C_CONTIGUOUS | NPY_ARRAY_ALIGNED, NULL);
            if (view == NULL) {
                Py_CLEAR(result);
                goto done;
            }
            PyList_SET_ITEM(row, k, view);
            Py_INCREF(owner); /* stolen by the call: the view's base */
            if (PyArray_SetBaseObject((PyArrayObject *)view, owner) < 0) {
                Py_CLEAR(result);
                goto done;
            }
        }
    }
done:
    Py_XDECREF(owner);
    Py_XDECREF(dtype);
    PyMem_Free(dims);
    PyMem_Free(offsets);
    PyMem_Free(starts);
    PyMem_Free(ndims);
    return result;
}

/* ---- freeze ----------------------------------------------------------------------------- */

/* freeze(array) -> a read-only array of the same memory, shape, strides and dtype
 *
 * `array`: exactly a numpy.ndarray of a number dtype. The result's base is an _Owner of
 * `array`: it can never be made writable, and it keeps `array` (and its memory) alive.
 */
static PyObject *
cpass_freeze(PyObject *Py_UNUSED(self), PyObject *arg)
{
    if (check_array(arg, "freeze()'s argument") < 0) {
        return NULL;
    }
    PyArrayObject *array = (PyArrayObject *)arg;
    int nd = PyArray_NDIM(array);
    if (nd > NPY_MAXDIMS) {
        PyErr_SetString(PyExc_ValueError, "an array has more dimensions than this build knows");
        return NULL;
    }
    /* Copied before the allocations below, which may run a finalizer that reshapes it. */
    npy_intp dims[NPY_MAXDIMS], strides[NPY_MAXDIMS];
    for (int k = 0; k < nd; k++) {
        dims[k] = PyArray_DIMS(array)[k];
        strides[k] = PyArray_STRIDES(array)[k];
    }
    char *data = PyArray_BYTES(array);
    PyArray_Descr *dtype = PyArray_DESCR(array);
    Py_INCREF(dtype); /* stolen by PyArray_NewFromDescr */
    PyObject *owner = owner_new(array);
    if (owner == NULL) {
        Py_DECREF(dtype);
        return NULL;
    }
    /* With strides given, numpy works out the contiguity and alignment flags itself. */
    PyObject *frozen =
        PyArray_NewFromDescr(&PyArray_Type, dtype, nd, dims, strides, data, 0, NULL);
    if (frozen == NULL) {
        Py_DECREF(owner);
        return NULL;
    }
    if (PyArray_SetBaseObject((PyArrayObject *)frozen, owner) < 0) { /* steals `owner` */
        Py_DECREF(frozen);
        return NULL;
    }
    return frozen;
}

static PyMethodDef cpass_methods[] = {
    {"describe", cpass_describe, METH_VARARGS,
     "describe(values, by_dtype) -> (specs, dtype, shapes) | None"},
    {"pack", cpass_pack, METH_VARARGS,
     "pack(row, lo, hi, dtype, shapes, out) -> bytes written, or -1"},
    {"views", cpass_views, METH_VARARGS,
     "views(flat, n, shapes, lo, hi) -> n lists of read-only views"},
    {"freeze", cpass_freeze, METH_O,
     "freeze(array) -> a read-only array of its memory that cannot be made writable"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef cpass_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "_cpass",
    .m_doc = "One C-level pass over a batch of numpy arrays (the Python pass is in "
             "asyncreplica_numpy/_backend.py).",
    .m_size = -1,
    .m_methods = cpass_methods,
};

PyMODINIT_FUNC
PyInit__cpass(void)
{
    import_array();
    if (PyType_Ready(&OwnerType) < 0) {
        return NULL;
    }
    return PyModule_Create(&cpass_module);
}
