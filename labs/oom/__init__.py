"""OOM lab: reproduce, diagnose and fix the out-of-memory failures of LLM serving.

`diagnose` (torch-free) turns measured numbers into a cause and a knob;
`scenarios` (torch) reproduces each failure on the GPU it runs on.
Run `python -m labs.oom --help`.
"""
