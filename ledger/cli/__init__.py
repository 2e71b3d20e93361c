"""The `ipledger` command line: a thin click layer over the library (each command parses, calls, renders)."""
