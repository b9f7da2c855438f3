# PyObject_GC_UnTrack, declared for the compiled listing (service/_listing.py
# and stores/lmdb/layout.py's records_under): Cython ships no declaration of
# it. A public function of CPython's C API (its effect shows from Python as
# gc.is_tracked); it takes the object as a pointer.
cdef extern from "Python.h":
    void PyObject_GC_UnTrack(void *op)
