#!/bin/sh
# Runs "$@" with an Open MPI session directory of its own (OMPI_MCA_orte_tmpdir_base), removed
# after: Open MPI 4's shared per-host one races between concurrent mpiruns (open-mpi/ompi#8510),
# as ctest's parallel jobs start them. The ctest tests that start mpirun themselves run under
# it; the test binaries do the same in-process (mpi_session_dir_test.cpp). A caller's own
# choice is kept.
if [ -n "$OMPI_MCA_orte_tmpdir_base" ]; then exec "$@"; fi
dir=$(mktemp -d "${TMPDIR:-/tmp}/autosp-mpi.XXXXXX") || exit 1
OMPI_MCA_orte_tmpdir_base=$dir "$@"
rc=$?
rm -rf "$dir"
exit $rc
