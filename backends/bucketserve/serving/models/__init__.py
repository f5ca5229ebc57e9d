"""The Triton Python models' glue: everything that imports `triton_python_backend_utils`, kept thin."""
