"""`tracerl view RUN_DIR`: the trace viewer, a read-only web page over a run directory.

Owns the viewer: reading the run while it is written (`reader`), the token view (`tokens`),
conversations as displayed (`conversation`), group advantages for display (`advantages`),
the HTML (`pages`, with the scripts and stylesheet in `static/`) and the HTTP server
(`server`). It never writes to the run directory, and no framework package imports it.
"""
