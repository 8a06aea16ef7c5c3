"""`python -m dwell.tracker`: the tracker process (dwell.tracker.service)."""

from dwell import memory

if __name__ == "__main__":
    # First of all: the process runs again on glibc's allocator, and whatever it had
    # imported by then is imported again.
    memory.use_system_allocator()
    from dwell.tracker.service import main

    main()
