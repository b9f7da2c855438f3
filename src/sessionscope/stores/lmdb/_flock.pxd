# flock(2), declared for the compiled writer lock (``_locks.py``): Cython
# ships no declaration of it. Python's fcntl.flock parses its arguments and
# lets go of the interpreter's lock around every call, even one that cannot
# wait; called from C, a try (LOCK_NB) and an unlock keep it.
cdef extern from "<sys/file.h>" nogil:
    int flock(int fd, int operation)
    const int LOCK_EX
    const int LOCK_NB
    const int LOCK_UN
