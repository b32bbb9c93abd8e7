# ATTNMIX_WITH_MPI: the attnmix::mpi target (distributed EM over Open MPI). ON by default when MPI is found.
find_package(MPI COMPONENTS CXX QUIET)
if(MPI_CXX_FOUND)
  option(ATTNMIX_WITH_MPI "Build attnmix::mpi (distributed EM with MPI)" ON)
else()
  option(ATTNMIX_WITH_MPI "Build attnmix::mpi (distributed EM with MPI)" OFF)
endif()
if(ATTNMIX_WITH_MPI AND NOT MPI_CXX_FOUND)
  message(FATAL_ERROR "ATTNMIX_WITH_MPI is ON but no MPI was found (Debian: libopenmpi-dev openmpi-bin; "
                      "scripts/install-deps.sh installs them)")
endif()
if(ATTNMIX_WITH_MPI)
  find_program(ATTNMIX_MPIEXEC NAMES mpirun mpiexec HINTS ${MPIEXEC_EXECUTABLE})
endif()
