"""kind with a node image assembled here, for machines that reach no container registry (air-gapped
machines, CI): nodeimage.py builds it from the project's own builds and Debian's packages."""
