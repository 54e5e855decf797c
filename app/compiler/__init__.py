"""The compile worker process (``python -m app.compiler``): lowers and compiles training
steps for compile checks, apart from the serving runtime. Imports nothing of the HTTP side."""
